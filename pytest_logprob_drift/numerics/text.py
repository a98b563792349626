"""Plain-text rendering of a comparison's full-vocabulary and semantic-offset diagnostics.

Owns how the CLI run table, the plugin's failure text and junit properties, and the HTML
report show the ``full_vocabulary`` and ``semantic_offset`` entries of comparison.json's
diagnostics (written by ``execute.diagnostics``, checked by ``store.divergence_check``): two
table cells, a few lines, and name/value properties per case. Knows nothing about torch, files
or how the numbers were computed; a comparison without the entries renders as nothing (the
table keeps its columns only when some case has them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

HEADERS = ("KL(r||t) mean", "TV max")


def _entries(comparison: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    diagnostics = comparison.get("diagnostics") or {}
    full = diagnostics.get("full_vocabulary") or {}
    offset = diagnostics.get("semantic_offset") or {}
    return (
        full if isinstance(full, Mapping) else {},
        offset if isinstance(offset, Mapping) else {},
    )


def has_full_vocabulary(comparisons: Sequence[Mapping[str, Any]]) -> bool:
    return any(_entries(c)[0] for c in comparisons)


def _number(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) else "-"


def stat_text(stats: Any, key: str) -> str:
    """A statistic as text, with the infinite positions it leaves out."""
    return _stat(stats, key)


def _stat(stats: Any, key: str) -> str:
    """A statistic, with the infinite positions it leaves out (KL where supports differ)."""
    if not isinstance(stats, Mapping):
        return "-"
    infinite = stats.get("infinite") or 0
    if stats.get(key) is None and infinite:
        return f"inf at all {infinite}"
    text = _number(stats.get(key))
    return f"{text} (inf at {infinite} more)" if infinite else text


def cells(comparison: Mapping[str, Any]) -> list[str]:
    """The two table cells (mean KL(rollout || training), max TV), or ``-``."""
    full, _ = _entries(comparison)
    if "unavailable" in full:
        return ["n/a", "n/a"]
    return [
        _stat(full.get("kl_rollout_training"), "mean"),
        _stat(full.get("total_variation"), "max"),
    ]


def lines(comparison: Mapping[str, Any]) -> list[str]:
    """A few lines: the reductions, the worst position with its top tokens, the offset."""
    full, offset = _entries(comparison)
    out: list[str] = []
    if "unavailable" in full:
        out.append(f"full vocabulary: unavailable ({full['unavailable']})")
    elif full:
        out.append(
            f"full vocabulary over {full.get('positions')} positions: KL(rollout||training) mean "
            f"{_stat(full.get('kl_rollout_training'), 'mean')} max "
            f"{_stat(full.get('kl_rollout_training'), 'max')}; KL(training||rollout) mean "
            f"{_stat(full.get('kl_training_rollout'), 'mean')}; TV mean "
            f"{_stat(full.get('total_variation'), 'mean')} max "
            f"{_stat(full.get('total_variation'), 'max')}; truncated supports at "
            f"{full.get('truncated_positions')} positions"
        )
        worst = full.get("worst_positions") or []
        if worst:
            w = worst[0]
            tokens = ", ".join(
                f"{t['token_id']} ({_number(t.get('rollout_logprob'))} vs "
                f"{_number(t.get('training_logprob'))})"
                for t in w.get("top_tokens", [])
            )
            out.append(
                f"  worst position: sample {w['sample']} position {w['position']}, TV "
                f"{_number(w.get('total_variation'))}; top tokens (rollout vs training "
                f"logprob): {tokens}"
            )
    if offset.get("fires"):
        out.append(f"semantic offset: {offset.get('message')}")
    return out


REDUCTIONS = (
    ("kl_rollout_training", "KL(rollout||training)"),
    ("kl_training_rollout", "KL(training||rollout)"),
    ("total_variation", "TV"),
)
"""``(summary key, display name)`` of the reductions a report shows."""


def entries(comparison: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """``(full_vocabulary, semantic_offset)`` entries of a comparison (empty when absent)."""
    return _entries(comparison)


def _raw(value: Any) -> str:
    return "-" if value is None else str(value)


def properties(comparison: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Name/value pairs (junit properties) of the diagnostics; none without them.

    Per reduction ``drift_<key>_max`` / ``_mean`` (over the finite positions, as
    comparison.json summarizes them) and ``_infinite`` (positions where it is infinite: the
    supports differ); ``drift_full_vocab_worst_positions``: the worst positions with their
    top tokens as JSON; ``drift_semantic_offset`` (its line), ``_fires`` and
    ``_explanation``."""
    full, offset = _entries(comparison)
    out: list[tuple[str, str]] = []
    if "unavailable" in full:
        out.append(("drift_full_vocab_unavailable", str(full["unavailable"])))
    elif full:
        out.append(("drift_full_vocab_positions", _raw(full.get("positions"))))
        for key, _ in REDUCTIONS:
            found = full.get(key)
            stats: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
            out += [
                (f"drift_{key}_max", _raw(stats.get("max"))),
                (f"drift_{key}_mean", _raw(stats.get("mean"))),
                (f"drift_{key}_infinite", _raw(stats.get("infinite"))),
            ]
        out.append(("drift_truncated_positions", _raw(full.get("truncated_positions"))))
        out.append(
            (
                "drift_full_vocab_worst_positions",
                json.dumps(full.get("worst_positions") or [], sort_keys=True),
            )
        )
    if offset:
        out += [
            ("drift_semantic_offset", str(offset.get("message", ""))),
            ("drift_semantic_offset_fires", str(bool(offset.get("fires")))),
            ("drift_semantic_offset_explanation", str(offset.get("explanation") or "none")),
        ]
    return out
