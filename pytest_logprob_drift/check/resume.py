"""Resume and offline verification of sealed attempts.

Owns deciding whether an existing attempt may stand in for executing a case again: the seal is
intact (every file's SHA-256, nothing unsealed, plain names only, no symbolic links; under a
seal key its MAC verifies), ``comparison.json`` parses strictly into its record
(``CheckedAttempt.comparison``, which the runner carries in its results), the execution key
equals the current one, the tensor payloads load with ``weights_only=True`` from the exact
bytes that were hashed (each byte read and hashed once), ``token_diffs.pt`` holds exactly the
logprobs and mask of ``score_rollout.pt`` and ``score_training.pt``, and the verdict
recomputed offline from it under the installed contract's threshold (``check.rejudge``: never
a sealed threshold) agrees with ``comparison.json``, figure for figure, and so does
each installed diagnostic's part (``diagnostics.registry``: each checks its own), and each
side's sealed weight digests show exactly the differences recorded and the two sides agree
(``check.weights_check``); an imported step's ``imported.json`` agrees with its attempt
(``check.imported_check``), and a v3 step (its own document set) seals no requested,
materialized, actual or identity document and its execution key is what ``imported.json`` and
``comparison.json`` make.
Partial, malformed or tampered attempts are reported and skipped; an older valid attempt may
still be reused. Used by the runner, ``check.verify`` and the report. Never writes anything;
knows nothing about engines or runtimes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch

from pytest_logprob_drift.check.imported_check import check_imported, sealed_key_payload
from pytest_logprob_drift.check.rejudge import rejudge
from pytest_logprob_drift.check.sealed_tensors import check_positions, check_sealed_tensors
from pytest_logprob_drift.check.weights_check import check_document, check_pair, check_weights
from pytest_logprob_drift.diagnostics.registry import installed
from pytest_logprob_drift.numerics.comparison import NUMERIC_CHECK_KEYS, Comparison, NumericCheck
from pytest_logprob_drift.numerics.gates import GateResult, gate_results
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.attempt import Seal, execution_key, read_seal
from pytest_logprob_drift.store.comparison import parse_comparison
from pytest_logprob_drift.store.decode import Document, JSONDocumentError, decode
from pytest_logprob_drift.store.documents import (
    ATTEMPT_DOCUMENTS,
    STEP_V3,
    Actual,
    IdentityDocument,
    ImportedStep,
    WeightsDocument,
)
from pytest_logprob_drift.store.seal import SealError
from pytest_logprob_drift.tensorio import TensorFormatError, tensors_from_bytes

T = TypeVar("T")

TENSOR_OUTCOMES = (Outcome.PASS, Outcome.MISMATCH, Outcome.ZERO_ACTIVE_TOKENS)
TOKEN_DIFF_KEYS = {"training_logprobs", "rollout_logprobs", "active_mask", "threshold"}
JSON_FILES = (layout.REQUESTED, layout.MATERIALIZED, layout.ACTUAL, layout.IDENTITY)
"""The documents every attempt seals but an imported step of its own document set (v3
``imported.json``, which seals none of them); ``layout.OPTIONAL_DOCUMENTS`` are checked where
sealed."""
TENSOR_FILES = (layout.SCORE_ROLLOUT, layout.SCORE_TRAINING, layout.TOKEN_DIFFS)
CROSS_CHECKS = (
    ("rollout_logprobs", layout.SCORE_ROLLOUT, "logprobs"),
    ("active_mask", layout.SCORE_ROLLOUT, "active_mask"),
    ("training_logprobs", layout.SCORE_TRAINING, "logprobs"),
)
"""``token_diffs.pt`` tensors and the scored tensor each must equal bit for bit."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckedAttempt:
    directory: Path
    seal: Seal
    comparison: Comparison
    """comparison.json's record; an attempt sealed before the importance-sampling figures
    existed gets them here, computed from its token_diffs.pt."""
    gates: tuple[GateResult, ...] = ()
    """The frameworks' gates (``numerics.gates``) of a judged attempt, computed from its
    token_diffs.pt where it is checked (never sealed: they are the frameworks' bars, not the
    verdict); empty for an outcome without scores."""
    documents: Mapping[str, Document] = field(default_factory=dict, repr=False, compare=False)
    """Every sealed JSON document beside comparison.json (``ATTEMPT_DOCUMENTS``), decoded once
    from the bytes the seal checked, by file name: a reader of a checked attempt (the report)
    takes them from here instead of reading them again."""

    @property
    def outcome(self) -> Outcome:
        return self.comparison.outcome


def _sealed_bytes(directory: Path, name: str, seal: Seal) -> bytes:
    """The bytes of sealed file ``name``: those ``read_seal`` kept (already hashed), else read
    now, once, and checked against the seal (``Sealed.read``; the seal was read from
    ``directory``)."""
    return seal.read(name)


def load_sealed_tensors(directory: Path, name: str, seal: Seal) -> dict[str, torch.Tensor]:
    """Load a sealed ``.pt`` from the very bytes whose digest is checked; tensors only, each
    as its file declares it (``check.sealed_tensors``)."""
    data = _sealed_bytes(directory, name, seal)
    try:
        tensors = tensors_from_bytes(data)
    except TensorFormatError as exc:
        raise SealError(name, str(exc)) from None
    check_sealed_tensors(name, tensors)
    return tensors


def load_sealed_document(directory: Path, name: str, seal: Seal, kind: type[T]) -> T:
    """A sealed JSON document decoded into ``kind`` (``store.decode``) from the very bytes
    whose digest is checked; a SealError naming the file and the JSON path (or byte offset)
    otherwise."""
    data = _sealed_bytes(directory, name, seal)
    try:
        return decode(data, kind)
    except JSONDocumentError as exc:
        raise SealError(name, str(exc)) from None


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bytes (NaN equals the same NaN; -0.0 differs from 0.0)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(
        torch.equal(
            a.detach().cpu().contiguous().reshape(-1).view(torch.uint8),
            b.detach().cpu().contiguous().reshape(-1).view(torch.uint8),
        )
    )


def cross_check(diffs: dict[str, torch.Tensor], scored: dict[str, dict[str, torch.Tensor]]) -> None:
    """``token_diffs.pt`` must hold exactly what the two sides scored: a SealError naming the
    first tensor that differs."""
    for key, name, source in CROSS_CHECKS:
        tensors = scored[name]
        if source not in tensors:
            raise SealError(name, f"has no {source!r} tensor to cross-check token_diffs.pt with")
        if not _same_bits(diffs[key], tensors[source]):
            raise SealError(
                layout.TOKEN_DIFFS,
                f"{key} differs from {name}'s {source} (the verdict's input is not what was "
                "scored)",
            )


def _token_diff_shape(diffs: dict[str, torch.Tensor]) -> None:
    """token_diffs.pt holds its four tensors, the threshold one number."""
    if set(diffs) != TOKEN_DIFF_KEYS:
        raise SealError(
            layout.TOKEN_DIFFS, f"expected tensors {sorted(TOKEN_DIFF_KEYS)}, found {sorted(diffs)}"
        )
    if diffs["threshold"].numel() != 1:
        raise SealError(layout.TOKEN_DIFFS, "threshold must be a single number")


def _same_numeric_check(recorded: NumericCheck | None, numeric: NumericCheck) -> None:
    """The recorded re-check must equal the one recomputed from ``token_diffs.pt``: a
    SealError naming the first value that differs."""
    want = numeric.as_sealed(recorded).to_json()
    got = {} if recorded is None else recorded.to_json()
    for key in NUMERIC_CHECK_KEYS:
        if got.get(key) != want.get(key):
            raise SealError(
                layout.TOKEN_DIFFS,
                f"offline recomputation gives {key}={want.get(key)!r}, comparison.json records "
                f"{got.get(key)!r}",
            )


def _sealed_if_present(
    directory: Path, seal: Seal, names: tuple[str, ...]
) -> dict[str, dict[str, torch.Tensor] | None]:
    """Each opt-in diagnostic file of ``names``: its digest-checked tensors, or None where the
    attempt sealed no such file."""
    return {
        name: load_sealed_tensors(directory, name, seal) if name in seal.files else None
        for name in names
    }


def _imported_step(directory: Path, seal: Seal) -> ImportedStep | None:
    """The attempt's imported.json (None: not an imported step); its form decides which
    documents the attempt must seal."""
    if layout.IMPORTED not in seal.files:
        return None
    return load_sealed_document(directory, layout.IMPORTED, seal, ImportedStep)


def check_attempt(directory: Path, *, expected_key: str | None) -> CheckedAttempt:
    """Raise SealError naming the file at fault unless the attempt is complete and consistent."""
    seal = read_seal(
        directory,
        keep=(
            layout.COMPARISON,
            *JSON_FILES,
            *layout.OPTIONAL_DOCUMENTS,
            *TENSOR_FILES,
            *layout.DIAGNOSTIC_FILES,
        ),
    )
    if expected_key is not None and seal.execution_key != expected_key:
        raise SealError(
            layout.COMPLETE,
            "execution key differs from the current execution "
            "(identity, materialization, scorer, operators or environment changed)",
        )
    comparison = parse_comparison(_sealed_bytes(directory, layout.COMPARISON, seal))
    outcome = comparison.outcome
    if comparison.case_id != seal.case_id:
        raise SealError(layout.COMPARISON, "case id differs from the seal")
    identity: IdentityDocument | None = None
    actual: Actual | None = None
    weights: dict[str, WeightsDocument] = {}
    documents: dict[str, Document] = {}
    imported = _imported_step(directory, seal)
    own_set = imported is not None and imported.self_contained
    for name, kind in ATTEMPT_DOCUMENTS.items():
        if name not in seal.files:
            if name in JSON_FILES and not own_set:
                raise SealError(name, "required file is not sealed")
            continue
        if own_set and name != layout.IMPORTED:
            raise SealError(name, f"sealed beside a {STEP_V3} imported.json (a step seals none)")
        if name == layout.IMPORTED and imported is not None:
            documents[name] = imported  # decoded once, above
            continue
        document = load_sealed_document(directory, name, seal, kind)
        documents[name] = document
        if isinstance(document, WeightsDocument):
            side = "rollout" if name == layout.WEIGHTS_ROLLOUT else "training"
            check_document(name, document)
            check_weights(name, document, side, outcome)
            weights[name] = document
        if isinstance(document, IdentityDocument):
            identity = document
        if isinstance(document, Actual):
            actual = document
        if (
            isinstance(document, IdentityDocument)
            and execution_key(document.execution_key_payload.payload()) != seal.execution_key
        ):
            raise SealError(
                layout.COMPLETE,
                "execution key does not match the execution-key payload sealed in identity.json",
            )
    check_pair(
        weights,
        None if identity is None else identity.execution_key_payload.materialization,
        (layout.WEIGHTS_ROLLOUT, layout.WEIGHTS_TRAINING),
        None if actual is None else actual.knobs,
    )
    has_tensors = layout.TOKEN_DIFFS in seal.files
    gates: tuple[GateResult, ...] = ()
    if outcome in TENSOR_OUTCOMES and not has_tensors:
        raise SealError(layout.TOKEN_DIFFS, f"required for outcome {outcome.value} but not sealed")
    if has_tensors:
        scored = {}
        for name in (layout.SCORE_ROLLOUT, layout.SCORE_TRAINING):
            if name not in seal.files:
                raise SealError(name, "required file is not sealed")
            scored[name] = load_sealed_tensors(directory, name, seal)
        check_positions(scored, derived=imported is not None)
        diffs = load_sealed_tensors(directory, layout.TOKEN_DIFFS, seal)
        _token_diff_shape(diffs)
        numeric = rejudge(comparison, diffs)
        cross_check(diffs, scored)
        if imported is not None:
            payload = None if identity is None else identity.execution_key_payload.payload()
            check_imported(imported, comparison, payload, diffs)
        _same_numeric_check(comparison.numerical, numeric)
        if outcome in TENSOR_OUTCOMES and outcome is not numeric.outcome:
            raise SealError(
                layout.COMPARISON,
                f"outcome {outcome.value} disagrees with the "
                f"recomputed verdict {numeric.outcome.value}",
            )
        for diagnostic in installed():
            files = _sealed_if_present(directory, seal, diagnostic.sealed_files)
            comparison = diagnostic.check(comparison, diffs, files, scored)
        if outcome in (Outcome.PASS, Outcome.MISMATCH):
            gates = gate_results(
                diffs["training_logprobs"],
                diffs["rollout_logprobs"],
                diffs["active_mask"],
                slime_figure=comparison.diagnostics.slime_train_rollout_logprob_abs_diff,
            )
    if imported is not None and own_set:  # last: what each document says is checked first
        if execution_key(sealed_key_payload(imported, comparison)) != seal.execution_key:
            raise SealError(
                layout.COMPLETE,
                "execution key does not match what imported.json and comparison.json make",
            )
    return CheckedAttempt(
        directory=directory, seal=seal, comparison=comparison, gates=gates, documents=documents
    )
