"""Reading a run directory into a report: statuses, the shown attempt of each case, plot data.

Owns turning ``RUN_DIR`` into ``model.ReportData``: the verify status of every attempt (from
``check.verify.verify_run``, the same check ``verify`` runs), the newest ``ok`` attempt of each
case as that check decoded it (``on_ok``: its documents, its comparison, the bytes it hashed,
so each attempt's files are read and hashed once and what is shown is what was checked; past
``HELD_BYTES`` a tensor is read again through the store's digest-checked loader, so a file
changed since the check is refused), the sealed attribution when there is one (with
what ``verify`` finds wrong with it), which cases get a detailed section (at most
``MAX_DETAILED``: the cases that did not pass, then by attribution rank and max |diff|), and
for those the aggregated plot data: |diff| on a fixed log grid, |diff| by response position
binned to at most ``PROFILE_MAX_BINS`` bins with at most ``PROFILE_MAX_LINES`` sample lines
plus the range and median over all samples, and the logprob scatter (every point up to
``SCATTER_MAX_POINTS``, else a 2-D histogram with the worst tokens on top), and the worst
tokens with their text through a decoder the frontend hands in, and each shown sample's tokens
(``token_view``). Invalid, tampered or incomplete attempts are listed, never loaded for
plotting. Never writes. Knows nothing about how the page looks, engines or tokenizers.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import numpy as np
import torch

from pytest_logprob_drift.attribution.document import Attribution
from pytest_logprob_drift.attribution.sealed import (
    CheckedSeals,
    attribution_dirs,
    latest_attribution,
    read_attribution,
    verify_attribution,
)
from pytest_logprob_drift.check import weights_check
from pytest_logprob_drift.check.imported_check import sealed_key_payload
from pytest_logprob_drift.check.resume import CheckedAttempt, load_sealed_tensors
from pytest_logprob_drift.check.verify import AttemptStatus, require_run_dir, verify_run
from pytest_logprob_drift.diagnostics.registry import installed
from pytest_logprob_drift.errors import StorageError
from pytest_logprob_drift.numerics.comparison import Diagnostics
from pytest_logprob_drift.numerics.sample_drift import SampleDrift, sample_drift
from pytest_logprob_drift.records import JsonValue
from pytest_logprob_drift.report.columns import case_anchor
from pytest_logprob_drift.report.model import (
    HIST_BINS_PER_DECADE,
    HIST_LOG10_HIGH,
    HIST_LOG10_LOW,
    CaseDetail,
    CaseView,
    DecoderFactory,
    Header,
    Histogram,
    PositionProfile,
    ReportData,
    Scatter,
    TokenDecoder,
    WorstToken,
)
from pytest_logprob_drift.report.steps import (
    WORST_PER_STEP,
    StepRow,
    StepSample,
    StepsView,
    figure_values,
    steps_view,
)
from pytest_logprob_drift.report.token_html import sample_anchor
from pytest_logprob_drift.report.token_view import limits_note, token_view
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.decode import Document, JSONDocumentError, decode
from pytest_logprob_drift.store.documents import (
    Actual,
    ExperimentDocument,
    IdentityDocument,
    ImportedStep,
    PlanRow,
    Requested,
    WeightsDocument,
)
from pytest_logprob_drift.store.files import read_regular
from pytest_logprob_drift.store.run import read_plan_log
from pytest_logprob_drift.store.seal import SealError

MAX_DETAILED = 24
"""Cases with a detailed section; the others are summarized by their table row."""
WORST_TOKENS = 10
CONTEXT_BEFORE, CONTEXT_AFTER = 4, 2
PROFILE_MAX_BINS = 120
PROFILE_MAX_LINES = 8
SCATTER_MAX_POINTS = 4000

SCATTER_GRID = 80
SCATTER_OVERLAY = 300
NO_VALID_ATTEMPT = "NO_VALID_ATTEMPT"


def aggregation_notes(detailed_limit: int) -> tuple[str, ...]:
    """How the page aggregates, in words (printed on the page)."""
    return (
        f"At most {detailed_limit} cases get a detailed section: every case that did not "
        "pass first, then the others by attribution rank and max |diff|; every case has a "
        "row in the table.",
        f"Histogram: active-token |diff| on a fixed log grid ({HIST_BINS_PER_DECADE} bins per "
        f"decade, 1e{HIST_LOG10_LOW:+.0f} to 1e{HIST_LOG10_HIGH:+.0f}); exact zeros are "
        "counted apart; the red line is the contract threshold.",
        f"|diff| by response position: positions binned into at most {PROFILE_MAX_BINS} bins; "
        f"each line is one sample's max |diff| per bin; with more than {PROFILE_MAX_LINES} "
        f"samples only the {PROFILE_MAX_LINES} with the largest max |diff| are drawn, and the "
        "grey band and black line give the range and median over all samples.",
        f"Scatter: every active token up to {SCATTER_MAX_POINTS} tokens; above that a "
        f"{SCATTER_GRID}x{SCATTER_GRID} 2-D histogram (log colour) with the "
        f"{SCATTER_OVERLAY} worst tokens drawn as points; red = mismatch.",
        limits_note(),
    )


# --------------------------------------------------------------------------- sealed reads


def _plan_rows(run_dir: Path) -> dict[str, PlanRow]:
    """The rows of the run's sealed plan (verify_run has refused a run whose sealed plan
    holds a line that is not a row)."""
    try:
        log = read_plan_log(run_dir)
    except StorageError:
        return {}
    return {row.case_id: row for row in log.rows}


def _experiment(run_dir: Path) -> tuple[ExperimentDocument | None, tuple[str, ...]]:
    """The run's experiment.json, or None and the note saying why the report goes without
    it (its header and an import's steps view are then not shown; verify lists the file)."""
    try:
        return decode(read_regular(run_dir / layout.EXPERIMENT), ExperimentDocument), ()
    except (OSError, JSONDocumentError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return None, (
            f"{layout.EXPERIMENT} is not read ({why}): the run's header and the steps view "
            "of an import are not shown",
        )


HELD_BYTES = 512 << 20
"""The sealed bytes the report keeps from the check (``verify_run``'s ``on_ok``): every shown
attempt's files while they fit, so each is read and hashed once; beyond, an attempt keeps its
decoded documents only and a tensor it shows is read again, digest-checked, when plotted."""

D = TypeVar("D", bound=Document)


class _Checked:
    """The newest ``ok`` attempt of each case as ``verify_run`` checked it (``on_ok``)."""

    def __init__(self, budget: int) -> None:
        self.by_case: dict[str, CheckedAttempt] = {}
        self.budget = budget
        self.held = 0

    def __call__(self, checked: CheckedAttempt) -> None:
        case_id = checked.seal.case_id
        previous = self.by_case.get(case_id)
        if previous is not None:
            if previous.seal.attempt_id > checked.seal.attempt_id:
                return
            self.held -= _held(previous)
        if self.held + _held(checked) > self.budget:  # keep the documents, not the bytes
            checked = dataclasses.replace(
                checked, seal=dataclasses.replace(checked.seal, contents={})
            )
        self.held += _held(checked)
        self.by_case[case_id] = checked


def _held(checked: CheckedAttempt) -> int:
    return sum(len(data) for data in checked.seal.contents.values())


def _document(checked: CheckedAttempt, name: str, kind: type[D]) -> D:
    """The checked attempt's decoded document ``name`` (check_attempt requires it)."""
    document = checked.documents.get(name)
    if not isinstance(document, kind):
        raise SealError(name, "required file is not sealed")
    return document


class _Shown:
    """A case's shown attempt as ``verify_run`` checked it: its seal (and the bytes it kept)
    and its decoded documents; nothing is read again but a tensor whose bytes were not kept
    (``HELD_BYTES``), checked against the seal from the bytes read."""

    def __init__(self, checked: CheckedAttempt) -> None:
        self.directory = checked.directory
        self.seal = checked.seal
        self.comparison = checked.comparison
        self.gates = checked.gates
        self.actual = checked.documents.get(layout.ACTUAL)
        self.imported = checked.documents.get(layout.IMPORTED)
        self.requested: Requested | None = None
        self.identity: IdentityDocument | None = None
        self.key_payload: Mapping[str, JsonValue]
        """What the attempt's execution key hashes (environment, runtime, contract)."""
        if isinstance(self.imported, ImportedStep) and self.imported.self_contained:
            # an imported step of its own documents: nothing requested, no sides' identity
            self.key_payload = sealed_key_payload(self.imported, checked.comparison)
        else:
            self.requested = _document(checked, layout.REQUESTED, Requested)
            self.identity = _document(checked, layout.IDENTITY, IdentityDocument)
            self.key_payload = self.identity.execution_key_payload.payload()
        self.weights = tuple(
            (side, weights_check.summary(_document(checked, name, WeightsDocument)))
            for side, name in (
                ("rollout", layout.WEIGHTS_ROLLOUT),
                ("training", layout.WEIGHTS_TRAINING),
            )
            if name in checked.documents
        )


# --------------------------------------------------------------------------- plot data


def histogram(diff: torch.Tensor) -> Histogram:
    """``diff``: float64 |diff| of the active tokens."""
    zeros = int((diff == 0).sum())
    positive = diff[diff > 0]
    bins = int((HIST_LOG10_HIGH - HIST_LOG10_LOW) * HIST_BINS_PER_DECADE)
    index = torch.floor((torch.log10(positive) - HIST_LOG10_LOW) * HIST_BINS_PER_DECADE)
    index = index.clamp(0, bins - 1).to(torch.int64)
    counts = torch.bincount(index, minlength=bins)
    return Histogram(counts=counts.numpy().astype(np.int64), zeros=zeros)


def position_profile(
    diff_grid: torch.Tensor, active: torch.Tensor, starts: torch.Tensor
) -> PositionProfile:
    """``diff_grid``: float64 |diff| ``[B, T]``; ``starts``: each sample's first response
    column."""
    samples, width = active.shape
    columns = torch.arange(width).expand(samples, width)
    response = (columns - starts.view(-1, 1)).clamp(min=0)
    length = int(response[active].max()) + 1 if bool(active.any()) else 1
    bin_width = max(1, math.ceil(length / PROFILE_MAX_BINS))
    bins = math.ceil(length / bin_width)
    rows, cols = active.nonzero(as_tuple=True)
    target = (rows * bins + response[rows, cols] // bin_width).to(torch.int64)
    maxima = torch.full((samples * bins,), -1.0, dtype=torch.float64)
    maxima.scatter_reduce_(0, target, diff_grid[rows, cols], reduce="amax", include_self=True)
    maxima = maxima.view(samples, bins)
    present = maxima >= 0
    grid = torch.where(present, maxima, torch.tensor(float("nan"), dtype=torch.float64))
    peak = torch.where(present, maxima, torch.tensor(-1.0, dtype=torch.float64)).amax(dim=1)
    has_tokens = peak >= 0
    order = torch.argsort(peak, descending=True, stable=True)
    drawn = [int(i) for i in order.tolist() if bool(has_tokens[i])][:PROFILE_MAX_LINES]
    drawn.sort()
    used = grid[has_tokens]
    if used.numel() == 0:
        used = torch.full((1, bins), float("nan"), dtype=torch.float64)
    band_low = torch.from_numpy(np.nanmin(_nan_safe(used.numpy()), axis=0))
    band_high = torch.from_numpy(np.nanmax(_nan_safe(used.numpy()), axis=0))
    median = torch.from_numpy(np.nanmedian(_nan_safe(used.numpy()), axis=0))
    return PositionProfile(
        bin_width=bin_width,
        starts=(torch.arange(bins) * bin_width).numpy().astype(np.int64),
        samples=np.asarray(drawn, dtype=np.int64),
        lines=grid[drawn].numpy() if drawn else np.zeros((0, bins)),
        band_low=band_low.numpy(),
        band_high=band_high.numpy(),
        median=median.numpy(),
        total_samples=int(has_tokens.sum()),
    )


def _nan_safe(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """A copy whose all-NaN columns are 0 (numpy's nan-reductions warn on them; a bin that no
    sample reaches cannot occur with one bin per ``bin_width`` positions up to the longest)."""
    out = array.copy()
    empty = np.all(np.isnan(out), axis=0)
    out[:, empty] = 0.0
    return out


def largest(values: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of the ``k`` largest of 1-D ``values``, largest first, ties in index order:
    ``argsort(values, descending=True, stable=True)[:k]`` without sorting them all (a top-k,
    then a stable sort of the values at or above the k-th)."""
    k = min(k, values.numel())
    if k == 0 or bool(torch.isnan(values).any()):  # NaN sorts as the largest: sort them all
        return torch.argsort(values, descending=True, stable=True)[:k]
    kth = torch.topk(values, k).values[-1]
    candidates = (values >= kth).nonzero().squeeze(1)
    return candidates[torch.argsort(values[candidates], descending=True, stable=True)][:k]


def scatter(
    rollout: torch.Tensor, training: torch.Tensor, diff: torch.Tensor, threshold: float
) -> Scatter:
    """Active tokens' logprobs (float64, flattened) and their |diff|; a token with a
    non-finite logprob is counted, not drawn."""
    total = int(rollout.numel())
    finite = torch.isfinite(rollout) & torch.isfinite(training)
    nonfinite = total - int(finite.sum())
    rollout, training, diff = rollout[finite], training[finite], diff[finite]
    mismatch = diff > threshold
    if int(rollout.numel()) <= SCATTER_MAX_POINTS:
        return Scatter(
            points=True,
            rollout=rollout.numpy(),
            training=training.numpy(),
            mismatch=mismatch.numpy(),
            total=total,
            nonfinite=nonfinite,
        )
    low = float(torch.minimum(rollout.min(), training.min()))
    high = float(torch.maximum(rollout.max(), training.max()))
    if high <= low:
        high = low + 1.0
    scale = SCATTER_GRID / (high - low)
    col = ((rollout - low) * scale).floor().clamp(0, SCATTER_GRID - 1).to(torch.int64)
    row = ((training - low) * scale).floor().clamp(0, SCATTER_GRID - 1).to(torch.int64)
    grid = torch.bincount(row * SCATTER_GRID + col, minlength=SCATTER_GRID * SCATTER_GRID)
    worst = largest(diff, SCATTER_OVERLAY)
    return Scatter(
        points=False,
        rollout=rollout[worst].numpy(),
        training=training[worst].numpy(),
        mismatch=mismatch[worst].numpy(),
        grid=grid.view(SCATTER_GRID, SCATTER_GRID).numpy().astype(np.int64),
        extent=(low, high, low, high),
        total=total,
        nonfinite=nonfinite,
    )


def _texts(decoder: TokenDecoder | None, ids: Sequence[int]) -> list[str] | None:
    if decoder is None or not ids:
        return None
    try:
        texts = list(decoder(ids))
    except Exception:  # a decoder that cannot handle an id: fall back to ids
        return None
    return texts if len(texts) == len(ids) else None


def worst_tokens(
    diff_grid: torch.Tensor,
    tensors: Mapping[str, torch.Tensor],
    rollout: torch.Tensor,
    training: torch.Tensor,
    starts: torch.Tensor,
    threshold: float,
    decoder: TokenDecoder | None,
) -> tuple[tuple[WorstToken, ...], bool]:
    active = tensors["active_mask"]
    masked = torch.where(active, diff_grid, torch.tensor(-1.0, dtype=torch.float64)).flatten()
    width = active.shape[1]
    order = largest(masked, WORST_TOKENS)
    token_ids = tensors["token_ids"]
    valid = tensors.get("attention_mask", torch.ones_like(active))
    picked = [(int(i) // width, int(i) % width) for i in order.tolist() if masked[i] >= 0]
    windows: list[tuple[int, int, list[int]]] = []
    for sample, column in picked:
        lo = max(0, column - CONTEXT_BEFORE)
        hi = min(width, column + CONTEXT_AFTER + 1)
        ids = [int(token_ids[sample, c]) if bool(valid[sample, c]) else -1 for c in range(lo, hi)]
        windows.append((lo, column, ids))
    flat = sorted({i for _, _, ids in windows for i in ids if i >= 0})
    texts = _texts(decoder, flat)
    by_id = dict(zip(flat, texts, strict=True)) if texts is not None else {}
    worst = []
    for (sample, column), (lo, _, ids) in zip(picked, windows, strict=True):

        def text(token: int) -> str:
            return by_id.get(token, str(token)) if token >= 0 else ""

        at = column - lo
        worst.append(
            WorstToken(
                sample=sample,
                position=column - int(starts[sample]),
                token_id=int(token_ids[sample, column]),
                text=by_id.get(int(token_ids[sample, column])) if texts is not None else None,
                before=tuple(text(t) for t in ids[:at] if t >= 0),
                after=tuple(text(t) for t in ids[at + 1 :] if t >= 0),
                rollout=float(rollout[sample, column]),
                training=float(training[sample, column]),
                abs_diff=float(diff_grid[sample, column]),
                mismatch=bool(diff_grid[sample, column] > threshold),
            )
        )
    return tuple(worst), texts is not None


def _identity_checks(identity: IdentityDocument | None) -> tuple[tuple[str, str, str, bool], ...]:
    if identity is None:  # an imported step of its own documents: one record, no sides
        return ()
    rollout = identity.rollout or {}
    training = identity.training or {}
    checks = []
    for key in sorted(set(rollout) | set(training)):
        r, t = rollout.get(key), training.get(key)
        checks.append((key, json.dumps(r), json.dumps(t), r == t))
    return tuple(checks)


def _decoder_for(
    identity: IdentityDocument | None,
    factory: DecoderFactory | None,
    cache: dict[str, TokenDecoder | None],
) -> TokenDecoder | None:
    if factory is None:
        return None
    checkpoint = {} if identity is None else dict(identity.identity.get("checkpoint") or {})
    digest = None if identity is None else (identity.rollout or {}).get("checkpoint_digest")
    if checkpoint.get("digest") is None and digest is not None:
        checkpoint["digest"] = digest
    key = json.dumps(checkpoint, sort_keys=True)
    if key not in cache:
        try:
            cache[key] = factory(checkpoint)
        except Exception:  # no tokenizer for this checkpoint: ids are shown
            cache[key] = None
    return cache[key]


def case_detail(
    shown: _Shown,
    factory: DecoderFactory | None,
    cache: dict[str, TokenDecoder | None],
    required: Sequence[int] = (),
) -> CaseDetail | None:
    """The plot data of a case whose scores are sealed (None otherwise); ``required``: the
    samples its token view shows whatever their max |diff|."""
    seal = shown.seal
    if layout.TOKEN_DIFFS not in seal.files or layout.SCORE_ROLLOUT not in seal.files:
        return None
    diffs = load_sealed_tensors(shown.directory, layout.TOKEN_DIFFS, seal)
    batch = load_sealed_tensors(shown.directory, layout.SCORE_ROLLOUT, seal)
    active = diffs["active_mask"]
    if active.dtype != torch.bool or not bool(active.any()):
        return None
    threshold = float(diffs["threshold"].item())
    training = diffs["training_logprobs"].to(torch.float64)
    rollout = diffs["rollout_logprobs"].to(torch.float64)
    diff_grid = (training - rollout).abs()
    if "prompt_lengths" in batch:
        starts = batch["prompt_lengths"].to(torch.int64)
    else:  # the first active column of each sample
        starts = torch.argmax(active.to(torch.int8), dim=1)
    diff = diff_grid[active]
    actual = shown.actual if isinstance(shown.actual, Actual) else None
    worst, decoded = worst_tokens(
        diff_grid,
        {**batch, "active_mask": active},
        rollout,
        training,
        starts,
        threshold,
        _decoder_for(shown.identity, factory, cache),
    )
    decoder = _decoder_for(shown.identity, factory, cache)
    top_ids = sorted(
        {
            token_id
            for diagnostic in installed()
            for token_id in diagnostic.report_token_ids(shown.comparison.diagnostics)
        }
    )
    top_texts = _texts(decoder, top_ids)
    tokens = (
        token_view(
            token_ids=batch["token_ids"],
            rollout=diffs["rollout_logprobs"],
            training=diffs["training_logprobs"],
            active=active,
            starts=starts,
            threshold=threshold,
            texts=lambda ids: _texts(decoder, ids),
            required=required,
        )
        if "token_ids" in batch
        else None
    )
    return CaseDetail(
        tokens=tokens,
        top_token_texts=dict(zip(top_ids, top_texts, strict=True)) if top_texts else {},
        histogram=histogram(diff),
        profile=position_profile(diff_grid, active, starts),
        scatter=scatter(rollout[active], training[active], diff, threshold),
        worst=worst,
        decoded=decoded,
        identity_checks=_identity_checks(shown.identity),
        training_evidence=dict((actual and actual.training_evidence) or {}),
        read_back=dict((actual and actual.read_back) or {}),
        plots={
            diagnostic.name: plot
            for diagnostic in installed()
            if (plot := diagnostic.report_plot(shown.directory, seal, shown.comparison.diagnostics))
            is not None
        },
    )


# --------------------------------------------------------------------------- the run


def usable_attribution(
    document: Attribution | None, statuses: Sequence[AttemptStatus]
) -> tuple[Attribution | None, tuple[str, ...]]:
    """The attribution without the entries computed from attempts that are no longer valid
    (None when the baseline's is not), and a note saying what was left out."""
    if document is None:
        return None, ()
    ok = {(s.case_id, s.attempt_id) for s in statuses if s.status == "ok"}
    if (document.baseline.case_id, document.baseline.attempt_id) not in ok:
        return None, (
            "The sealed attribution is not shown: the baseline attempt it was computed from "
            "is no longer valid.",
        )
    cases = [c for c in document.cases if (c.case_id, c.attempt_id) in ok]
    dropped = [c.label for c in document.cases if c not in cases]
    if not dropped:
        return document, ()
    kept = {c.label for c in cases}
    filtered = msgspec.structs.replace(
        document, cases=cases, ranking=[label for label in document.ranking if label in kept]
    )
    return filtered, (
        "Left out of the attribution (computed from attempts that are no longer valid): "
        + ", ".join(dropped)
        + ".",
    )


def _detail_order(
    views: Sequence[CaseView],
    attribution: Attribution | None,
    steps: Mapping[str, _StepWorst] | None = None,
) -> list[CaseView]:
    """Failing cases first, then by attribution rank and max |diff|; for an imported run,
    the steps holding the run's worst samples first (``report.steps``' ranking)."""
    rank = {label: i for i, label in enumerate(attribution.ranking if attribution else ())}
    worst = sorted(
        (w.drift.rank_key(), case_id)
        for case_id, info in (steps or {}).items()
        for w in info.worst[:1]
    )
    by_worst = {case_id: i for i, (_, case_id) in enumerate(worst)}

    def key(view: CaseView) -> tuple[int, int, int, float, str]:
        failing = view.outcome != "PASS"
        baseline = not view.changed
        max_diff = view.diagnostics.max_abs_diff
        return (
            by_worst.get(view.case_id, len(by_worst)),
            0 if failing else (1 if baseline else 2),
            rank.get(view.label, len(rank)),
            -(max_diff if max_diff is not None else -1.0),
            view.label,
        )

    return sorted(views, key=key)


def _relative(path: Path, page_dir: Path) -> str:
    """``path`` as a link from a page in ``page_dir``."""
    return Path(os.path.relpath(path.resolve(), page_dir.resolve())).as_posix()


def load_report(
    run_dir: Path,
    *,
    page_dir: Path,
    decoder_factory: DecoderFactory | None = None,
    detailed_limit: int = MAX_DETAILED,
) -> ReportData:
    """Everything the page and the terminal show about ``run_dir``; links are relative to
    ``page_dir`` (where the page will be written)."""
    require_run_dir(run_dir)
    checked = _Checked(HELD_BYTES)
    statuses = tuple(verify_run(run_dir, on_ok=checked))
    plan = _plan_rows(run_dir)
    experiment, experiment_notes = _experiment(run_dir)
    sealed, rejected = _checked_attribution(
        run_dir, {(c.seal.case_id, c.seal.attempt_id): c.seal for c in checked.by_case.values()}
    )
    attribution, left_out = usable_attribution(sealed, statuses)
    entries = {e.case_id: e for e in (attribution.cases if attribution else ())}
    by_case: dict[str, list[AttemptStatus]] = {}
    for status in statuses:
        by_case.setdefault(status.case_id, []).append(status)
    late_problems: list[AttemptStatus] = []
    shown: dict[str, _Shown] = {}
    views: list[CaseView] = []
    for case_id, attempts in sorted(by_case.items()):
        newest = checked.by_case.get(case_id)
        picked = None if newest is None else _Shown(newest)
        invalid = sum(1 for s in attempts if s.status != "ok")
        row = plan.get(case_id)
        if picked is None:
            views.append(
                CaseView(
                    case_id=case_id,
                    label=case_id if row is None else row.label,
                    changed=() if row is None else row.changed,
                    outcome=NO_VALID_ATTEMPT,
                    reason=f"no valid sealed attempt ({invalid} invalid or incomplete); "
                    "nothing of it is plotted",
                    attempt_id=None,
                    active_tokens=None,
                    mismatches=None,
                    threshold=None,
                    diagnostics=Diagnostics(),
                    records=(),
                    identity_violations=(),
                    files=(),
                    attribution=None,
                    detail=None,
                    invalid_attempts=invalid,
                )
            )
            continue
        shown[case_id] = picked
        comparison = picked.comparison
        files = tuple(
            (name, _relative(picked.directory / name, page_dir))
            for name in [*sorted(picked.seal.files), layout.COMPLETE]
        )
        views.append(
            CaseView(
                case_id=case_id,
                label=comparison.label,
                changed=() if picked.requested is None else picked.requested.changed,
                outcome=comparison.outcome.value,
                reason=comparison.reason,
                attempt_id=picked.seal.attempt_id,
                active_tokens=comparison.active_tokens,
                mismatches=comparison.mismatches,
                threshold=comparison.threshold,
                diagnostics=comparison.diagnostics,
                records=comparison.records,
                identity_violations=comparison.identity_violations,
                files=files,
                attribution=entries.get(case_id),
                detail=None,
                invalid_attempts=invalid,
                gates=picked.gates,
                weights=picked.weights,
            )
        )
    imported = experiment is not None and experiment.imported is not msgspec.UNSET
    steps = _step_worst(shown, late_problems) if imported else None
    chosen = {
        v.case_id
        for v in _detail_order([v for v in views if v.case_id in shown], attribution, steps)[
            :detailed_limit
        ]
    }
    cache: dict[str, TokenDecoder | None] = {}
    final: list[CaseView] = []
    for view in views:
        if view.case_id in chosen:
            try:
                required = (
                    [w.drift.row for w in steps[view.case_id].worst]
                    if steps is not None and view.case_id in steps
                    else []
                )
                detail = case_detail(shown[view.case_id], decoder_factory, cache, required)
            except SealError as exc:
                late_problems.append(AttemptStatus.refused(view.case_id, str(view.attempt_id), exc))
                detail = None
            view = _with_detail(view, detail)
        final.append(view)
    final.sort(key=lambda v: (v.changed != (), _natural(v.label)))
    return ReportData(
        header=_header(run_dir, experiment, shown.values()),
        cases=tuple(final),
        statuses=statuses + tuple(late_problems),
        attribution=attribution,
        detailed_limit=detailed_limit,
        notes=aggregation_notes(detailed_limit) + left_out + experiment_notes,
        unread=experiment_notes,
        attribution_problems=rejected if attribution is not None else (),
        steps=None if steps is None else _steps_view(final, steps, experiment),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Worst:
    drift: SampleDrift
    sample: int | None
    source: str


@dataclass(frozen=True, slots=True, kw_only=True)
class _StepWorst:
    """An imported step's sealed ``imported.json`` facts and its worst samples."""

    step: int
    samples: int
    worst: tuple[_Worst, ...]


def _row_source(imported: ImportedStep, row: int) -> tuple[int | None, str]:
    """A grid row's framework sample id and ``file:line`` / ``file[index]``."""
    entry = imported.rows[row]
    name = Path(imported.inputs[entry.input]).name
    where = (
        f"{name}:{entry.line}"
        if entry.line is not None
        else f"{name}[{entry.index}]"
        if entry.index is not None
        else name
    )
    return entry.sample, where


def _step_worst(
    shown: Mapping[str, _Shown], problems: list[AttemptStatus]
) -> dict[str, _StepWorst]:
    """Each imported step's worst samples (``WORST_PER_STEP``), ranked from its sealed
    tensors by ``numerics.sample_drift`` (judged steps only; one step's tensors at a time)."""
    out: dict[str, _StepWorst] = {}
    for case_id, picked in shown.items():
        seal = picked.seal
        imported = picked.imported
        if not isinstance(imported, ImportedStep):
            continue
        try:
            ranked: list[SampleDrift] = []
            if picked.comparison.outcome.value in ("PASS", "MISMATCH"):
                diffs = load_sealed_tensors(picked.directory, layout.TOKEN_DIFFS, seal)
                ranked = sorted(
                    sample_drift(
                        diffs["training_logprobs"],
                        diffs["rollout_logprobs"],
                        diffs["active_mask"],
                        float(diffs["threshold"].item()),
                        step=imported.step,
                    ),
                    key=SampleDrift.rank_key,
                )[:WORST_PER_STEP]
        except SealError as exc:  # changed since verify_run checked it
            problems.append(AttemptStatus.refused(case_id, seal.attempt_id, exc))
            continue
        except ValueError:  # tensors a verdict would not judge: no ranking
            ranked = []
        worst = []
        for drift in ranked:
            sample, source = _row_source(imported, drift.row)
            worst.append(_Worst(drift=drift, sample=sample, source=source))
        out[case_id] = _StepWorst(step=imported.step, samples=imported.samples, worst=tuple(worst))
    return out


def _steps_view(
    views: Sequence[CaseView],
    steps: Mapping[str, _StepWorst],
    experiment: ExperimentDocument | None,
) -> StepsView:
    """The steps view of an imported run: figures from each step's sealed comparison, worst
    samples from its sealed tensors, each linked to its tokens when the step is detailed."""
    rows = []
    threshold = 0.0
    for view in views:
        info = steps.get(view.case_id)
        if info is None:
            continue
        if view.threshold is not None:
            threshold = view.threshold
        tokens = view.detail.tokens if view.detail is not None else None
        shown = {s.sample for s in tokens.samples} if tokens is not None else set()
        rows.append(
            StepRow(
                step=info.step,
                case_id=view.case_id,
                label=view.label,
                outcome=view.outcome,
                samples=info.samples,
                active_tokens=view.active_tokens,
                mismatches=view.mismatches,
                values=figure_values(view.diagnostics, view.active_tokens, view.mismatches),
                gates=view.gates,
                worst=tuple(
                    StepSample(
                        row=w.drift.row,
                        sample=w.sample,
                        source=w.source,
                        active=w.drift.active,
                        mismatches=w.drift.mismatches,
                        max_abs_diff=w.drift.max_abs_diff,
                        anchor=sample_anchor(view.case_id, w.drift.row)
                        if w.drift.row in shown
                        else None,
                    )
                    for w in info.worst
                ),
                anchor=case_anchor(view) if view.detail is not None else None,
            )
        )
    if experiment is not None and isinstance(experiment.contract.get("threshold"), (int, float)):
        threshold = float(experiment.contract["threshold"])
    return steps_view(rows, threshold)


def _checked_attribution(
    run_dir: Path, checked: CheckedSeals
) -> tuple[Attribution | None, tuple[str, ...]]:
    """The newest sealed attribution whose seal holds, and what ``verify`` finds wrong with it
    (a re-sealed document, attempts that changed): the page shows it marked as rejected. The
    attempts ``verify_run`` has just checked (``checked``) are not checked again."""
    document = latest_attribution(run_dir)
    if document is None:
        return None, ()
    for directory in attribution_dirs(run_dir):
        try:
            same = read_attribution(directory) == document
        except (SealError, OSError, ValueError):
            continue
        if same:
            return document, tuple(verify_attribution(run_dir, directory, checked))
    return document, ()


def _natural(text: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders ``batch.size=2`` before ``batch.size=10``."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", text) if part
    )


def _with_detail(view: CaseView, detail: CaseDetail | None) -> CaseView:
    return dataclasses.replace(view, detail=detail)


def _header(
    run_dir: Path, experiment: ExperimentDocument | None, shown: Collection[_Shown]
) -> Header:
    payloads = [s.key_payload for s in shown]
    environments: list[Mapping[str, JsonValue]] = []
    for payload in payloads:
        environment = payload.get("environment") or {}
        if not isinstance(environment, Mapping):
            continue
        if environment not in environments:
            environments.append(environment)
    attempt_ids = sorted(s.seal.attempt_id for s in shown)
    contract: Mapping[str, JsonValue] = (
        experiment.contract
        if experiment is not None
        else next((c for p in payloads if isinstance(c := p.get("contract"), Mapping)), {})
    )
    return Header(
        experiment_id=run_dir.name if experiment is None else experiment.experiment_id,
        scenario_id="-" if experiment is None else experiment.scenario_id,
        scenario={} if experiment is None else dict(experiment.scenario),
        strategy="-" if experiment is None else experiment.strategy,
        contract=dict(contract),
        runtimes=tuple(
            sorted({r for p in payloads if isinstance(r := p.get("runtime"), str) and r})
        ),
        environments=tuple(environments),
        first_attempt=attempt_ids[0] if attempt_ids else None,
        last_attempt=attempt_ids[-1] if attempt_ids else None,
        run_dir=str(run_dir),
    )
