"""Plain-text rendering of a comparison's full-vocabulary and semantic-offset diagnostics.

Owns how the CLI run table, the plugin's failure text and junit properties, and the HTML
report show the full-vocabulary and semantic-offset parts of a comparison's typed diagnostics
(``numerics.comparison.Diagnostics``; written by ``execute.diagnostics``, checked by
``store.divergence_check``): two table cells, a few lines, and name/value properties per case.
Knows nothing about torch, files or how the numbers were computed; diagnostics without those
parts render as nothing (the table keeps its columns only when some case has them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from pytest_logprob_drift.numerics.comparison import (
    REDUCTION_KEYS,
    Diagnostics,
    ReductionStats,
)

HEADERS = ("KL(r||t) mean", "TV max")


def has_full_vocabulary(diagnostics: Iterable[Diagnostics | None]) -> bool:
    """Whether some case's diagnostics hold a full-vocabulary part (or why it is missing)."""
    return any(d is not None and d.full_vocabulary is not None for d in diagnostics)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def stat_text(stats: ReductionStats | None, key: str) -> str:
    """A statistic (``mean`` / ``p99`` / ``max``) as text, with the infinite positions it
    leaves out (KL where supports differ)."""
    if stats is None:
        return "-"
    value = stats.statistic(key)
    if value is None and stats.infinite:
        return f"inf at all {stats.infinite}"
    text = _number(value)
    return f"{text} (inf at {stats.infinite} more)" if stats.infinite else text


def cells(diagnostics: Diagnostics | None) -> list[str]:
    """The two table cells (mean KL(rollout || training), max TV), or ``-``."""
    if diagnostics is not None and diagnostics.unavailable is not None:
        return ["n/a", "n/a"]
    full = None if diagnostics is None else diagnostics.full_summary
    if full is None:
        return ["-", "-"]
    return [stat_text(full.kl_rollout_training, "mean"), stat_text(full.total_variation, "max")]


def lines(diagnostics: Diagnostics | None) -> list[str]:
    """A few lines: the reductions, the worst position with its top tokens, the offset."""
    if diagnostics is None:
        return []
    out: list[str] = []
    full = diagnostics.full_summary
    if diagnostics.unavailable is not None:
        out.append(f"full vocabulary: unavailable ({diagnostics.unavailable})")
    elif full is not None:
        out.append(
            f"full vocabulary over {full.positions} positions: KL(rollout||training) mean "
            f"{stat_text(full.kl_rollout_training, 'mean')} max "
            f"{stat_text(full.kl_rollout_training, 'max')}; KL(training||rollout) mean "
            f"{stat_text(full.kl_training_rollout, 'mean')}; TV mean "
            f"{stat_text(full.total_variation, 'mean')} max "
            f"{stat_text(full.total_variation, 'max')}; truncated supports at "
            f"{full.truncated_positions} positions"
        )
        if full.worst_positions:
            w = full.worst_positions[0]
            tokens = ", ".join(
                f"{t.token_id} ({_number(t.rollout_logprob)} vs {_number(t.training_logprob)})"
                for t in w.top_tokens
            )
            out.append(
                f"  worst position: sample {w.sample} position {w.position}, TV "
                f"{_number(w.total_variation)}; top tokens (rollout vs training "
                f"logprob): {tokens}"
            )
    offset = diagnostics.semantic_offset
    if offset is not None and offset.fires:
        out.append(f"semantic offset: {offset.message}")
    return out


REDUCTIONS = tuple(
    zip(REDUCTION_KEYS, ("KL(rollout||training)", "KL(training||rollout)", "TV"), strict=True)
)
"""``(summary key, display name)`` of the reductions a report shows."""


def _raw(value: object) -> str:
    return "-" if value is None else str(value)


def properties(diagnostics: Diagnostics | None) -> list[tuple[str, str]]:
    """Name/value pairs (junit properties) of the diagnostics; none without them.

    Per reduction ``drift_<key>_max`` / ``_mean`` (over the finite positions, as
    comparison.json summarizes them) and ``_infinite`` (positions where it is infinite: the
    supports differ); ``drift_full_vocab_worst_positions``: the worst positions with their
    top tokens as JSON; ``drift_semantic_offset`` (its line), ``_fires`` and
    ``_explanation``."""
    if diagnostics is None:
        return []
    out: list[tuple[str, str]] = []
    full = diagnostics.full_summary
    if diagnostics.unavailable is not None:
        out.append(("drift_full_vocab_unavailable", diagnostics.unavailable))
    elif full is not None:
        out.append(("drift_full_vocab_positions", _raw(full.positions)))
        for key, _ in REDUCTIONS:
            stats = full.reduction(key)
            out += [
                (f"drift_{key}_max", _raw(stats.max)),
                (f"drift_{key}_mean", _raw(stats.mean)),
                (f"drift_{key}_infinite", _raw(stats.infinite)),
            ]
        out.append(("drift_truncated_positions", _raw(full.truncated_positions)))
        out.append(
            (
                "drift_full_vocab_worst_positions",
                json.dumps([w.to_json() for w in full.worst_positions], sort_keys=True),
            )
        )
    offset = diagnostics.semantic_offset
    if offset is not None:
        out += [
            ("drift_semantic_offset", offset.message),
            ("drift_semantic_offset_fires", str(offset.fires)),
            ("drift_semantic_offset_explanation", offset.explanation or "none"),
        ]
    return out
