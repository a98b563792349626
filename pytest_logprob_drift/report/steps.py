"""Drift over training steps, for an imported production run: the steps view and its trend.

Owns what the report says about a run that ``logprob-drift import`` wrote (one case per
training step): per step the figures ``FIGURES`` names, taken from the step's sealed
comparison (which ``verify`` recomputes from the sealed tensors): the mismatch share (the
contract's mismatching active tokens over the active tokens), max and p99 |diff|, the token
ESS, and the share verl's TIS at cap 2, OpenRLHF's IcePop band [0.5, 5] and NeMo-RL's
seq-mask-tis band [0.999, 1.002] would clip, drop or mask; per step its worst samples (ranked
as ``numerics.sample_drift`` ranks them, read from the sealed tensors by ``report.load``); the
first step at which each figure crossed the contract; and the trend in one sentence, which the
findings lead with.

"Crossed the contract" is, for each figure, the value no step whose every active token is
within the threshold can reach: a mismatch share above 0; a max or p99 |diff| above the
threshold; a token ESS below ``1 / cosh(threshold)^2`` (the least ESS of weights
``exp(r)``, ``|r| <= threshold``: Kantorovich's bound); a clipped or masked share above 0 (each
band's edges lie beyond ``exp(+-threshold)``, so something it clips has a token beyond the
threshold; ``crossing_line`` refuses a band for which that is not so). A step without figures
(ZERO_ACTIVE_TOKENS, INVALID_ARTIFACT, no valid attempt) crosses nothing and is a gap in the
plot. Knows nothing about files, seals, torch or how the view is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from pytest_logprob_drift.numerics.comparison import Diagnostics
from pytest_logprob_drift.numerics.gates import GateResult
from pytest_logprob_drift.numerics.peer_corrections import PEER_CORRECTIONS
from pytest_logprob_drift.records import JsonObject
from pytest_logprob_drift.report import gates

WORST_PER_STEP = 3
"""Worst samples listed per step (each linked to its tokens when the step is detailed)."""

TIS_CAP_2 = "tis_clipped_token_fraction_cap_2"
ICEPOP = "icepop_dropped_token_fraction"
SEQ_MASK_TIS = "seq_mask_tis_masked_sequence_fraction_0999_1002"


@dataclass(frozen=True, slots=True, kw_only=True)
class Figure:
    """One line of the steps plot: its key, its name, and how it crosses the contract."""

    key: str
    name: str
    kind: str
    """``share`` (a fraction), ``diff`` (nats) or ``ess`` (normalized, in (0, 1])."""
    crosses: str
    """``above`` or ``below`` its contract line."""


FIGURES: tuple[Figure, ...] = (
    Figure(key="mismatch_share", name="mismatch share", kind="share", crosses="above"),
    Figure(key="max_abs_diff", name="max |diff|", kind="diff", crosses="above"),
    Figure(key="p99_abs_diff", name="p99 |diff|", kind="diff", crosses="above"),
    Figure(key="ess", name="token ESS", kind="ess", crosses="below"),
    Figure(key="tis_cap_2", name="TIS cap 2 clipped share", kind="share", crosses="above"),
    Figure(key="icepop", name="IcePop dropped share", kind="share", crosses="above"),
    Figure(key="seq_mask_tis", name="seq-mask-tis masked share", kind="share", crosses="above"),
)
_CORRECTION_KEYS = {"tis_cap_2": TIS_CAP_2, "icepop": ICEPOP, "seq_mask_tis": SEQ_MASK_TIS}


def crossing_line(figure: Figure, threshold: float) -> float:
    """The value beyond which ``figure`` says some active token is beyond ``threshold``."""
    if figure.kind == "diff":
        return threshold
    if figure.kind == "ess":
        return 1.0 / math.cosh(threshold) ** 2
    key = _CORRECTION_KEYS.get(figure.key)
    if key is not None:
        peer = next(p for p in PEER_CORRECTIONS if p.key == key)
        for edge in (peer.low, peer.high):
            if edge is not None and abs(math.log(edge)) <= threshold:
                raise ValueError(f"{key}: band edge {edge} lies within exp(+-{threshold})")
    return 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSample:
    """One of a step's worst samples: its grid row, the framework's own id and where it was
    read from, its drift, and the anchor of its tokens on the page (None: not shown)."""

    row: int
    sample: int | None
    source: str
    """``file:line`` (JSONL, Parquet row) or ``file[index]`` (slime), as ``imported.json`` says."""
    active: int
    mismatches: int
    max_abs_diff: float
    anchor: str | None = None

    def to_json(self) -> JsonObject:
        return {
            "row": self.row,
            "sample": self.sample,
            "source": self.source,
            "active": self.active,
            "mismatches": self.mismatches,
            "max_abs_diff": self.max_abs_diff,
            "token_view": self.anchor is not None,
        }

    def words(self) -> str:
        name = f"sample {self.sample}" if self.sample is not None else f"row {self.row}"
        return (
            f"{name} ({self.source}): {self.mismatches}/{self.active} mismatching, max |diff| "
            f"{self.max_abs_diff:.3e}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRow:
    step: int
    case_id: str
    label: str
    outcome: str
    samples: int | None
    active_tokens: int | None
    mismatches: int | None
    values: dict[str, float | None]
    """Each ``FIGURES`` key's value (None: the step has no such figure)."""
    worst: tuple[StepSample, ...] = ()
    anchor: str | None = None
    """The step's detailed section on the page (None: not detailed)."""
    gates: tuple[GateResult, ...] = ()
    """The frameworks' gates of the step (``numerics.gates``; empty: not judged)."""

    def to_json(self) -> JsonObject:
        return {
            "step": self.step,
            "case_id": self.case_id,
            "label": self.label,
            "outcome": self.outcome,
            "samples": self.samples,
            "active_tokens": self.active_tokens,
            "mismatches": self.mismatches,
            **{f.key: self.values.get(f.key) for f in FIGURES},
            "worst_samples": [w.to_json() for w in self.worst],
            "detailed": self.anchor is not None,
            "gates_failed": None if not self.gates else [g.key for g in self.gates if not g.passed],
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Crossing:
    figure: Figure
    line: float
    step: int | None

    def words(self) -> str:
        where = "never" if self.step is None else f"at step {self.step}"
        side = ">" if self.figure.crosses == "above" else "<"
        return f"{self.figure.name} {side} {self.line:.6g}: {where}"


@dataclass(frozen=True, slots=True, kw_only=True)
class StepsView:
    rows: tuple[StepRow, ...]
    threshold: float
    crossings: tuple[Crossing, ...]

    @property
    def first_mismatch(self) -> int | None:
        return next((r.step for r in self.rows if r.outcome == "MISMATCH"), None)

    def trend(self) -> str:
        """The trend in one sentence: the mismatch share from the first judged step to the
        last (rose or fell only when every step moved that way, stayed only when no step
        moved; else its range and where it was reached), how many judged steps MISMATCH, and
        the first."""
        if not self.rows:
            return "No step has a valid attempt (verify lists why each is invalid)."
        judged = [r for r in self.rows if r.values.get("mismatch_share") is not None]
        if not judged:
            return f"No step of the {len(self.rows)} was judged (no active tokens or invalid)."
        first_mm = self.first_mismatch
        count = sum(1 for r in judged if r.outcome == "MISMATCH")
        tail = (
            f"first MISMATCH at step {first_mm} ({count} of {len(judged)} judged steps MISMATCH)"
            if first_mm is not None
            else "no step MISMATCHes"
        )
        shares = [float(r.values["mismatch_share"] or 0.0) for r in judged]
        a, b = judged[0], judged[-1]
        x, y = shares[0], shares[-1]
        if a is b:
            return f"The mismatch share was {percent(x)} at step {a.step}; {tail}."
        steps = list(pairwise(shares))
        if all(u == v for u, v in steps):
            span = f"stayed at {percent(x)} from step {a.step} to step {b.step}"
        elif all(u <= v for u, v in steps):
            span = f"rose from {percent(x)} at step {a.step} to {percent(y)} at step {b.step}"
        elif all(u >= v for u, v in steps):
            span = f"fell from {percent(x)} at step {a.step} to {percent(y)} at step {b.step}"
        else:
            low = min(range(len(shares)), key=shares.__getitem__)
            high = max(range(len(shares)), key=shares.__getitem__)
            span = (
                f"came and went between {percent(shares[low])} (step {judged[low].step}) and "
                f"{percent(shares[high])} (step {judged[high].step}) from step {a.step} to "
                f"step {b.step}"
            )
        return f"The mismatch share {span}; {tail}."

    def to_json(self) -> JsonObject:
        return {
            "threshold": self.threshold,
            "trend": self.trend(),
            "first_mismatch": self.first_mismatch,
            "figures": [
                {
                    "key": c.figure.key,
                    "name": c.figure.name,
                    "crosses": c.figure.crosses,
                    "line": c.line,
                    "first_step": c.step,
                }
                for c in self.crossings
            ],
            "steps": [r.to_json() for r in self.rows],
        }

    def table(self) -> tuple[list[str], list[list[str]]]:
        """``(headers, rows)`` of the text table."""
        headers = ["step", "outcome", "samples", "active", "mismatches"] + [f.name for f in FIGURES]
        headers.append(gates.TITLE)
        rows = [
            [
                str(r.step),
                r.outcome,
                _show(r.samples),
                _show(r.active_tokens),
                _show(r.mismatches),
                *(format_value(f, r.values.get(f.key)) for f in FIGURES),
                gates.failed_cell(r.gates),
            ]
            for r in self.rows
        ]
        return headers, rows

    def lines(self) -> list[str]:
        """The first crossings and each step's worst samples, in words."""
        out = ["first step each figure crossed the contract:"]
        out += [f"  {c.words()}" for c in self.crossings]
        out.append("worst samples per step (most mismatching active tokens, then max |diff|):")
        for r in self.rows:
            if r.worst:
                out.append(f"  step {r.step}: " + "; ".join(w.words() for w in r.worst))
        return out


def _show(value: int | None) -> str:
    return "-" if value is None else str(value)


def percent(share: float) -> str:
    return "0%" if share == 0 else f"{100 * share:.3g}%"


def format_value(figure: Figure, value: float | None) -> str:
    if value is None:
        return "-"
    if figure.kind == "share":
        return percent(value)
    if figure.kind == "ess":
        return f"{value:.6g}"
    return f"{value:.3e}"


def figure_values(
    diagnostics: Diagnostics, active: int | None, mismatches: int | None
) -> dict[str, float | None]:
    """The ``FIGURES`` values of one step from its sealed comparison."""
    figures = diagnostics.importance_sampling
    share = (
        mismatches / active
        if active and mismatches is not None and diagnostics.max_abs_diff is not None
        else None
    )
    values: dict[str, float | None] = {
        "mismatch_share": share,
        "max_abs_diff": diagnostics.max_abs_diff,
        "p99_abs_diff": diagnostics.p99_abs_diff,
        "ess": None if figures is None else figures.ess,
    }
    for key, correction in _CORRECTION_KEYS.items():
        values[key] = None if figures is None else figures.correction(correction)
    return values


def crossed(figure: Figure, value: float | None, line: float) -> bool:
    if value is None:
        return False
    return value > line if figure.crosses == "above" else value < line


def steps_view(rows: Sequence[StepRow], threshold: float) -> StepsView:
    """The view of ``rows`` (any order: sorted by step here) at the contract ``threshold``."""
    ordered = tuple(sorted(rows, key=lambda r: r.step))
    crossings = []
    for figure in FIGURES:
        line = crossing_line(figure, threshold)
        first = next(
            (r.step for r in ordered if crossed(figure, r.values.get(figure.key), line)), None
        )
        crossings.append(Crossing(figure=figure, line=line, step=first))
    return StepsView(rows=ordered, threshold=threshold, crossings=tuple(crossings))
