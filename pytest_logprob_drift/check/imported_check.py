"""An imported step's ``imported.json`` against the attempt that seals it.

Owns the case id of an imported step (the hash of the step schema, the format, the step, the
SHA-256 of the step's own source bytes and the contract source and version: the importer names
a case with it, verify recomputes it from ``imported.json``) and the cross-checks of
``imported.json`` with the rest of its attempt: the case id, the label (``step=<step>``), the
step the execution key payload names (``identity.json``'s for a v1/v2 step; a v3 step's payload
is ``imported_key_payload``, from ``imported.json`` and ``comparison.json``), one source row
per grid row, the dtype the logprobs are sealed in and, for a v2 or v3 step, its
``rows_sha256`` against its inputs' own SHA-256s where those determine it. Knows nothing about
the formats' bytes or how a step was judged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Final

import msgspec
import torch

from pytest_logprob_drift.numerics.comparison import Comparison
from pytest_logprob_drift.records import JsonValue, canonical_json, sha256_hex
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.documents import STEP_V1, ImportedStep
from pytest_logprob_drift.store.seal import SealError

LOGPROB_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def imported_case_id(fmt: str, step: int, rows_sha256: str, source: str, version: str) -> str:
    """The case id of an imported step (16 hex digits). It hashes the first form's schema
    name (``STEP_V1``) whatever the form of ``imported.json``: the same step of the same bytes
    under the same contract keeps its case id across forms (a run followed before v2 is
    followed on without a step "sealed from other bytes")."""
    return sha256_hex(
        canonical_json(
            {
                "schema": STEP_V1,
                "format": fmt,
                "step": step,
                "rows_sha256": rows_sha256,
                "contract": {"source": source, "version": version},
            }
        )
    )[:16]


def rank_files_sha256(digests: Iterable[str]) -> str:
    """A per-rank slime step's ``rows_sha256``: the SHA-256 of its rank files' SHA-256s (raw
    bytes, in rank-file order)."""
    digest = hashlib.sha256()
    for sha in digests:
        digest.update(bytes.fromhex(sha))
    return digest.hexdigest()


def derived_rows_sha256(imported: ImportedStep) -> frozenset[str] | None:
    """What a v2 step's ``rows_sha256`` may be, derived from its ``input_digests`` (None: not
    derivable: a v1 step, or a neutral step read from more than one file, whose lines hash
    together): a NeMo-RL step file's or a neutral step's one input's own SHA-256; a slime
    dump's, or the SHA-256 of its rank files' SHA-256s."""
    digests = imported.input_digests
    if digests is msgspec.UNSET:
        return None
    shas = [d.sha256 for d in digests]
    if imported.format == "slime":
        return frozenset(
            {rank_files_sha256(shas), *shas[:1]} if len(shas) == 1 else {rank_files_sha256(shas)}
        )
    return frozenset(shas) if len(shas) == 1 else None


def imported_label(step: int) -> str:
    """The label of an imported step's case."""
    return f"step={step}"


IMPORT_KEY_SCHEMA: Final = "cross_config.import_key.v2"
"""The form of a v3 step's execution-key payload (``imported_key_payload``); v1 and v2 steps
sealed theirs, in an executed case's shape, in ``identity.json``."""


def imported_key_payload(
    imported: ImportedStep, case_id: str, source: str, version: str, threshold: float
) -> dict[str, JsonValue]:
    """What a v3 step's execution key hashes (``store.attempt.execution_key``): the case, the
    step's source (format, step, ``rows_sha256``), the contract and the importing environment,
    all in ``imported.json`` and ``comparison.json`` (verify re-derives it offline)."""
    environment: dict[str, JsonValue] = (
        {} if imported.environment is msgspec.UNSET else dict(imported.environment)
    )
    return {
        "version": IMPORT_KEY_SCHEMA,
        "case_id": case_id,
        "imported": {
            "format": imported.format,
            "step": imported.step,
            "rows_sha256": imported.rows_sha256,
        },
        "runtime": f"import:{imported.format}",
        "contract": {"source": source, "version": version, "threshold": threshold},
        "environment": environment,
    }


def sealed_key_payload(imported: ImportedStep, comparison: Comparison) -> dict[str, JsonValue]:
    """A sealed v3 step's execution-key payload, from its two documents."""
    contract = comparison.contract
    return imported_key_payload(
        imported, comparison.case_id, contract.source, contract.version, contract.threshold
    )


def check_imported(
    imported: ImportedStep,
    comparison: Comparison,
    payload: Mapping[str, JsonValue] | None,
    diffs: Mapping[str, torch.Tensor],
) -> None:
    """A SealError on imported.json naming the first thing of the attempt it disagrees with:
    the case id it hashes to, the label, the source the execution key payload names
    (``payload``: identity.json's, None for a v3 step, whose key is re-derived from
    imported.json itself), the grid's rows or the logprobs' dtype."""
    case_id = imported_case_id(
        imported.format,
        imported.step,
        imported.rows_sha256,
        comparison.contract.source,
        comparison.contract.version,
    )
    if case_id != comparison.case_id:
        raise SealError(
            layout.IMPORTED,
            f"step {imported.step} of {imported.format} with rows_sha256 "
            f"{imported.rows_sha256[:16]}... hashes to case {case_id}, the attempt is case "
            f"{comparison.case_id}",
        )
    if comparison.label != imported_label(imported.step):
        raise SealError(
            layout.COMPARISON,
            f"label {comparison.label!r} is not that of step {imported.step} "
            f"({imported_label(imported.step)!r})",
        )
    derived = derived_rows_sha256(imported)
    if derived is not None and imported.rows_sha256 not in derived:
        raise SealError(
            layout.IMPORTED,
            f"rows_sha256 {imported.rows_sha256[:16]}... is not what its input_digests make "
            f"for a {imported.format} step of {len(imported.inputs)} input file(s)",
        )
    source = {
        "format": imported.format,
        "step": imported.step,
        "rows_sha256": imported.rows_sha256,
    }
    if payload is not None and payload.get("identity") != {"imported": source}:
        raise SealError(
            layout.IMPORTED,
            "format, step or rows_sha256 differ from the source identity.json's execution key "
            "payload names",
        )
    rows = diffs["active_mask"].shape[0] if diffs["active_mask"].dim() else 0
    if imported.samples != rows:
        raise SealError(
            layout.IMPORTED,
            f"names {imported.samples} source rows, the token grid has {rows}",
        )
    for key in ("training_logprobs", "rollout_logprobs"):
        if diffs[key].dtype != LOGPROB_DTYPES[imported.logprob_dtype]:
            raise SealError(
                layout.IMPORTED,
                f"logprob_dtype is {imported.logprob_dtype}, token_diffs.pt's {key} are "
                f"{diffs[key].dtype}",
            )
