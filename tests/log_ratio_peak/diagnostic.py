"""The ``log_ratio_peak`` diagnostic: the active token whose r = training - rollout is largest.

Its capture (``Diagnostic.capture``) takes the rollout engine's sampled token ids from the
scored case, on any runtime; the part names the token sampled at the peak, checked offline
against score_rollout.pt."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import torch

from log_ratio_peak.config import CONFIG_KEY
from pytest_logprob_drift.diagnostics.config_key import ConfigKey
from pytest_logprob_drift.diagnostics.protocol import (
    AttributionContribution,
    Captured,
    CaseUnderCapture,
    Scores,
    Tensors,
)
from pytest_logprob_drift.numerics.comparison import Comparison, Diagnostics, Record
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.records import JsonObject
from pytest_logprob_drift.report.markup import Markup, el
from pytest_logprob_drift.report.model import ReportData
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.attempt import Seal
from pytest_logprob_drift.store.seal import SealError

NAME = "log_ratio_peak"
HEADER = "peak r"
FILE = "log_ratio.pt"
"""Its sealed file: ``log_ratio`` [B, L] float64, training - rollout on active tokens, -inf
elsewhere."""


class LogRatioPeak(Record, frozen=True):
    """The part: the largest log-ratio over active tokens, where it is and the token the
    rollout engine sampled there (from the capture)."""

    log_ratio: float
    sample: int
    position: int
    token_id: int


class SampledTokens(msgspec.Struct, frozen=True):
    """The capture: the rollout engine's sampled token ids ``[B, L]`` of the case."""

    token_ids: list[list[int]]


def log_ratio(training: torch.Tensor, rollout: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """The sealed file's tensor from token_diffs.pt's three tensors (float64 differences)."""
    return (training.cpu().to(torch.float64) - rollout.cpu().to(torch.float64)).masked_fill(
        ~active.cpu(), -torch.inf
    )


def peak(
    training: torch.Tensor,
    rollout: torch.Tensor,
    active: torch.Tensor,
    token_ids: Sequence[Sequence[int]],
) -> LogRatioPeak:
    """The part from token_diffs.pt's three tensors and the sampled ``token_ids``."""
    r = log_ratio(training, rollout, active)
    flat = int(torch.argmax(r))
    sample, position = divmod(flat, r.shape[1])
    return LogRatioPeak(
        log_ratio=float(r.flatten()[flat]),
        sample=sample,
        position=position,
        token_id=int(token_ids[sample][position]),
    )


def _part(diagnostics: Diagnostics | None) -> LogRatioPeak | None:
    part = getattr(diagnostics, NAME, None)  # a member of the registry's assembled type
    return part if isinstance(part, LogRatioPeak) else None


@dataclass(frozen=True, slots=True)
class LogRatioPeakDiagnostic:
    name: str = NAME
    part_type: type[LogRatioPeak] = LogRatioPeak
    sealed_files: tuple[str, ...] = (FILE,)
    always_in_table: bool = False
    config_key: ConfigKey | None = CONFIG_KEY

    def capture(self, case: CaseUnderCapture) -> Captured | None:
        return SampledTokens(token_ids=case.rollout.tensors["token_ids"].tolist())

    def seal(
        self, outcome: Outcome, scores: Scores | None, captured: Captured | None
    ) -> Mapping[str, LogRatioPeak]:
        if outcome not in (Outcome.PASS, Outcome.MISMATCH) or scores is None:
            return {}
        if not isinstance(captured, SampledTokens):
            raise ValueError(f"{NAME}: a scored case without its capture")
        return {NAME: peak(*scores, captured.token_ids)}

    def files(
        self, outcome: Outcome, scores: Scores | None, captured: Captured | None
    ) -> Mapping[str, Tensors]:
        if outcome not in (Outcome.PASS, Outcome.MISMATCH) or scores is None:
            return {}
        return {FILE: {"log_ratio": log_ratio(*scores)}}

    def check(
        self,
        comparison: Comparison,
        diffs: Tensors,
        files: Mapping[str, Tensors | None],
        scored: Mapping[str, Tensors],
    ) -> Comparison:
        recorded = _part(comparison.diagnostics)
        sealed = files[FILE]
        if (recorded is None) != (sealed is None):
            raise SealError(FILE if sealed is None else layout.COMPARISON, "part without file")
        if recorded is None:
            return comparison
        assert sealed is not None
        scores = (diffs["training_logprobs"], diffs["rollout_logprobs"], diffs["active_mask"])
        if not torch.equal(sealed["log_ratio"], log_ratio(*scores)):
            raise SealError(FILE, "log_ratio differs from token_diffs.pt")
        again = peak(*scores, scored[layout.SCORE_ROLLOUT]["token_ids"].tolist())
        for field in LogRatioPeak.__struct_fields__:
            if getattr(recorded, field) != getattr(again, field):
                raise SealError(
                    layout.COMPARISON,
                    f"diagnostics.{NAME}.{field} differs from "
                    + (layout.SCORE_ROLLOUT if field == "token_id" else layout.TOKEN_DIFFS),
                )
        return comparison

    def shown(self, diagnostics: Sequence[Diagnostics | None]) -> bool:
        return any(_part(d) is not None for d in diagnostics)

    def table_headers(self) -> tuple[str, ...]:
        return (HEADER,)

    def table_cells(self, diagnostics: Diagnostics | None) -> list[str]:
        part = _part(diagnostics)
        return ["-" if part is None else f"{part.log_ratio:.6g}"]

    def run_lines(self, diagnostics: Diagnostics | None) -> list[str]:
        part = _part(diagnostics)
        return [] if part is None else [f"log-ratio peak at {part.sample}:{part.position}"]

    def failure_lines(self, diagnostics: Diagnostics | None) -> list[str]:
        return self.run_lines(diagnostics)

    def report_lines(self, diagnostics: Diagnostics | None) -> list[str]:
        return self.run_lines(diagnostics)

    def properties(self, diagnostics: Diagnostics | None) -> list[tuple[str, str]]:
        part = _part(diagnostics)
        return [] if part is None else [(f"drift_{NAME}", repr(part.log_ratio))]

    def json_parts(self, diagnostics: Diagnostics | None) -> JsonObject:
        part = _part(diagnostics)
        return {} if part is None else {NAME: msgspec.to_builtins(part)}

    def report_headers(self) -> tuple[str, ...]:
        return (HEADER,)

    def report_cells(self, diagnostics: Diagnostics) -> list[tuple[str, float | None]]:
        part = _part(diagnostics)
        return [("-", None) if part is None else (f"{part.log_ratio:.6g}", part.log_ratio)]

    def report_section(self, diagnostics: Diagnostics) -> Markup | None:
        part = _part(diagnostics)
        if part is None:
            return None
        return el(
            "section",
            el("h3", "Log-ratio peak"),
            el("p", f"r = {part.log_ratio!r} at sample {part.sample}, position {part.position}"),
            class_=NAME,
        )

    def report_plot(self, directory: Path, seal: Seal, diagnostics: Diagnostics) -> object | None:
        return None

    def report_figures(self, plot: object | None) -> tuple[tuple[str, Markup], ...]:
        return ()

    def attribution(self) -> AttributionContribution | None:
        return None  # it contributes nothing to the attribution document

    def report_page_headers(self, diagnostics: Sequence[Diagnostics]) -> tuple[str, ...]:
        return ()

    def report_page_cells(self, diagnostics: Diagnostics) -> list[tuple[str, float | None, str]]:
        return []

    def report_token_ids(self, diagnostics: Diagnostics) -> tuple[int, ...]:
        return ()

    def report_detail_section(
        self, diagnostics: Diagnostics, texts: Mapping[int, str]
    ) -> Markup | None:
        return None

    def report_run_lines(self, data: ReportData) -> list[str]:
        peak = _run_peak(data)
        return [] if peak is None else [f"largest log-ratio peak over every case: {peak}"]

    def report_run_section(self, data: ReportData, place: str, draw: bool) -> Markup | None:
        peak = _run_peak(data)
        if place != "body" or peak is None:
            return None
        return el(
            "section", el("h2", "Log-ratio peaks, every case"), el("p", peak), id=f"{NAME}-run"
        )


def _run_peak(data: ReportData) -> str | None:
    """``r = <r> (<label>)`` of the case with the largest peak (None: no case has a part)."""
    peaks = [
        (part.log_ratio, view.label)
        for view in data.cases
        if (part := _part(view.diagnostics)) is not None
    ]
    if not peaks:
        return None
    r, label = max(peaks)
    return f"r = {r!r} ({label})"


DIAGNOSTIC = LogRatioPeakDiagnostic()
