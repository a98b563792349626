"""The report's records: what the loader hands the renderers, as frozen plain data.

Owns the shape of a report: the run's header, one ``CaseView`` per case (its summary row, and
for the cases shown in detail the binned plot data, the worst tokens with their text, each
shown sample's tokens, the knob records and identity checks), the verify status of every
attempt, the attribution document, and the notes that say how the plots aggregate. Also the
type of the token decoder a frontend may hand in. Arrays are ``numpy`` arrays; nothing here
imports torch, matplotlib or an engine. Knows nothing about files, seals or how anything is
drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from pytest_logprob_drift.attribution.document import Attribution, Case
from pytest_logprob_drift.numerics.comparison import Diagnostics, KnobRecord
from pytest_logprob_drift.numerics.gates import GateResult
from pytest_logprob_drift.records import JsonValue
from pytest_logprob_drift.store.read_back import ReadBackValue

if TYPE_CHECKING:  # the record only; importing the store would import torch
    from pytest_logprob_drift.check.verify import AttemptStatus
    from pytest_logprob_drift.report.steps import StepsView

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

TokenDecoder = Callable[[Sequence[int]], Sequence[str]]
"""Token ids to the text of each token (one string per id)."""

DecoderFactory = Callable[[Mapping[str, JsonValue]], TokenDecoder | None]
"""Given the sealed identity's ``checkpoint`` mapping (``uri``, ``digest``, ...), the decoder of
its tokenizer, or None when there is none (the report then shows token ids). Frontends build
it (resolving a checkpoint and loading a tokenizer is engine territory)."""

HIST_LOG10_LOW, HIST_LOG10_HIGH, HIST_BINS_PER_DECADE = -12.0, 3.0, 10
"""The fixed histogram grid of |diff|: log10 from -12 to 3, 10 bins per decade; |diff| below
1e-12 (exact zeros are counted apart) falls in the first bin, above 1e3 in the last."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Histogram:
    """Counts of active-token |diff| on the fixed log grid, and the exact zeros."""

    counts: IntArray
    zeros: int


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class PositionProfile:
    """|diff| by response position: per drawn sample the max |diff| in each position bin
    (NaN where a sample has no active token in the bin), and the range and median over all
    samples' bin maxima."""

    bin_width: int
    starts: IntArray
    """First response position of each bin."""
    samples: IntArray
    """The sample index of each drawn line."""
    lines: FloatArray
    """``[len(samples), bins]``."""
    band_low: FloatArray
    band_high: FloatArray
    median: FloatArray
    total_samples: int


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Scatter:
    """Rollout vs training logprob: every point (``points`` True) or a 2-D histogram with the
    worst tokens as points on top."""

    points: bool
    rollout: FloatArray
    training: FloatArray
    mismatch: npt.NDArray[np.bool_]
    grid: IntArray | None = None
    """``[bins, bins]`` counts, rows = training, columns = rollout (2-D histogram mode)."""
    extent: tuple[float, float, float, float] | None = None
    """``(rollout_low, rollout_high, training_low, training_high)`` of the grid."""
    total: int = 0
    nonfinite: int = 0
    """Active tokens with a non-finite logprob on either side (counted in ``total``, never
    drawn: an axis cannot reach infinity)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorstToken:
    sample: int
    position: int
    """Response position (0 = the first sampled token)."""
    token_id: int
    text: str | None
    before: tuple[str, ...]
    after: tuple[str, ...]
    rollout: float
    training: float
    abs_diff: float
    mismatch: bool


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class SampleTokens:
    """One sample's shown response tokens (its active tokens, at most the view's limit), with
    both sides' logprobs as sealed (``float32`` when both are exact in it, else ``float64``)."""

    sample: int
    length: int
    """The sample's active (response) tokens in all."""
    positions: IntArray
    """Response position of each shown token."""
    token_ids: IntArray
    rollout: npt.NDArray[Any]
    training: npt.NDArray[Any]
    first_mismatch: int | None
    """Response position of the sample's first mismatch (shown or not); None: none."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenView:
    """The per-sample token view of a detailed case."""

    samples: tuple[SampleTokens, ...]
    total_samples: int
    """Samples with active tokens."""
    texts: Mapping[int, str]
    """The decoded text of each shown token id (empty without a tokenizer: ids are shown)."""
    threshold: float
    required: tuple[int, ...] = ()
    """Samples shown whatever their max |diff| (an imported step's worst samples)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseDetail:
    """What a case section shows beyond its table row."""

    histogram: Histogram
    profile: PositionProfile
    scatter: Scatter
    worst: tuple[WorstToken, ...]
    decoded: bool
    """Whether token text comes from the checkpoint's tokenizer (else ids)."""
    identity_checks: tuple[tuple[str, str, str, bool], ...]
    """``(field, rollout, training, same)`` for each side-identity field."""
    training_evidence: Mapping[str, JsonValue]
    read_back: Mapping[str, ReadBackValue]
    tokens: TokenView | None = None
    """Each shown sample's response tokens (None: the case's tensors give none)."""
    top_token_texts: Mapping[int, str] = field(default_factory=dict)
    """The text of each token id named at the full-vocabulary worst positions (empty without a
    tokenizer or without the diagnostics)."""
    plots: Mapping[str, object] = field(default_factory=dict)
    """Each installed diagnostic's plot data of the case (``Diagnostic.report_plot``), by
    name; none without."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseView:
    case_id: str
    label: str
    changed: tuple[str, ...]
    outcome: str
    """The sealed outcome, or ``NO_VALID_ATTEMPT`` when every attempt is invalid."""
    reason: str
    attempt_id: str | None
    active_tokens: int | None
    mismatches: int | None
    threshold: float | None
    diagnostics: Diagnostics
    records: tuple[KnobRecord, ...]
    identity_violations: tuple[str, ...]
    files: tuple[tuple[str, str], ...]
    """``(name, path relative to the page)`` of every sealed file of the shown attempt."""
    attribution: Case | None
    """The case's entry in the shown attribution (None without one)."""
    detail: CaseDetail | None
    invalid_attempts: int = 0
    gates: tuple[GateResult, ...] = ()
    """The frameworks' gates of the shown attempt (``numerics.gates``; empty: not judged)."""
    weights: tuple[tuple[str, str], ...] = ()
    """``(side, one line)`` of each side's sealed weight check (``check.weights_check.summary``):
    ``N tensors, all equal to the checkpoint cast to bfloat16``, or the differences."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Header:
    experiment_id: str
    scenario_id: str
    scenario: Mapping[str, JsonValue]
    strategy: str
    contract: Mapping[str, JsonValue]
    runtimes: tuple[str, ...]
    environments: tuple[Mapping[str, JsonValue], ...]
    """The distinct sealed environments (versions) of the shown attempts."""
    first_attempt: str | None
    last_attempt: str | None
    run_dir: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportData:
    header: Header
    cases: tuple[CaseView, ...]
    statuses: tuple[AttemptStatus, ...]
    attribution: Attribution | None
    detailed_limit: int
    notes: tuple[str, ...] = field(default=())
    attribution_problems: tuple[str, ...] = field(default=())
    """Why ``verify`` rejects the shown attribution (empty when it holds)."""
    steps: StepsView | None = None
    """Drift over training steps, for a run ``logprob-drift import`` wrote (None otherwise)."""
    unread: tuple[str, ...] = ()
    """A run file the report went without, and what is not shown for it (experiment.json
    that does not decode: the header and an import's steps view)."""

    @property
    def invalid(self) -> tuple[AttemptStatus, ...]:
        return tuple(s for s in self.statuses if s.status == "invalid")

    def case(self, label: str) -> CaseView:
        return next(c for c in self.cases if c.label == label)
