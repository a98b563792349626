"""Plain-text rendering of a comparison's path split (``diagnostics.path_split``).

Owns how the CLI run table, the plugin's failure text and junit properties show where the
drift enters (``numerics.comparison.PathSplit``; written by ``execute.replay``, checked by
``diagnostics.path_split.check``): two table cells (max |decode - prefill| inside the rollout
engine, max |prefill - training| across engines), a line, and ``drift_path_*`` properties. Knows
nothing about torch, files or how the numbers were computed; a comparison without a path split
renders as nothing (the table keeps its columns only when some case has one).
"""

from __future__ import annotations

from collections.abc import Iterable

from pytest_logprob_drift.numerics.comparison import PATH_PAIRS, Diagnostics, PathSplit

HEADERS = ("max|dec-pre|", "max|pre-train|")

PAIR_NAMES = {
    "decode_prefill": "decode-prefill",
    "prefill_training": "prefill-training",
    "decode_training": "decode-training",
}


def has_path_split(diagnostics: Iterable[Diagnostics | None]) -> bool:
    """Whether some case's diagnostics hold a path split."""
    return any(d is not None and d.path_split is not None for d in diagnostics)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _split(diagnostics: Diagnostics | None) -> PathSplit | None:
    return None if diagnostics is None else diagnostics.path_split


def _max(split: PathSplit, pair: str) -> str:
    if not split.prefill.ran:
        return "n/a"
    if not split.comparable.get(pair, False):
        return "incomparable"
    stats = None if split.figures is None else split.figures.pair(pair)
    return "-" if stats is None else _number(stats.max)


def cells(diagnostics: Diagnostics | None) -> list[str]:
    """The two table cells, ``-`` without a path split, ``n/a`` when the prefill replay did
    not run, ``incomparable`` for a pair of unlike logprobs."""
    split = _split(diagnostics)
    if split is None:
        return ["-", "-"]
    return [_max(split, "decode_prefill"), _max(split, "prefill_training")]


def lines(diagnostics: Diagnostics | None) -> list[str]:
    """The split's line(s): each pair's max/mean, the bitwise-equal share, each replay's
    status when it is not ``replay_ran``."""
    split = _split(diagnostics)
    if split is None:
        return []
    out: list[str] = []
    figures = split.figures
    if figures is not None:
        parts = []
        for pair in PATH_PAIRS:
            stats = figures.pair(pair)
            name = PAIR_NAMES[pair]
            parts.append(
                f"{name} incomparable"
                if stats is None
                else f"{name} max {_number(stats.max)} mean {_number(stats.mean)}"
            )
        bitwise = _share(figures.bitwise_equal_fraction)
        out.append(f"path split: {'; '.join(parts)}; decode==prefill bitwise on {bitwise}")
        replay = figures.decode_replay_decode
        if replay is not None:
            out.append(
                f"decode replay vs sampled: max {_number(replay.max)}, bitwise on "
                f"{_share(replay.bitwise_equal_fraction)}"
            )
    for what, status in (("prefill replay", split.prefill), ("decode replay", split.decode_replay)):
        if status.reason is not None:
            out.append(f"{what}: {status.status} ({status.reason})")
    return out


def properties(diagnostics: Diagnostics | None) -> list[tuple[str, str]]:
    """junit properties: ``drift_path_prefill_status`` / ``drift_path_decode_replay_status``
    (with ``_reason``), per pair ``drift_path_<pair>_max`` / ``_mean`` / ``_p99`` (``-``:
    incomparable or not run), ``drift_path_bitwise_equal_fraction``."""
    split = _split(diagnostics)
    if split is None:
        return []
    out: list[tuple[str, str]] = []
    for key, status in (("prefill", split.prefill), ("decode_replay", split.decode_replay)):
        out.append((f"drift_path_{key}_status", status.status))
        if status.reason is not None:
            out.append((f"drift_path_{key}_reason", status.reason))
    figures = split.figures
    for pair in PATH_PAIRS:
        stats = None if figures is None else figures.pair(pair)
        for stat in ("max", "mean", "p99"):
            value = None if stats is None else getattr(stats, stat)
            out.append((f"drift_path_{pair}_{stat}", "-" if value is None else repr(value)))
    share = None if figures is None else figures.bitwise_equal_fraction
    out.append(("drift_path_bitwise_equal_fraction", "-" if share is None else repr(share)))
    return out
