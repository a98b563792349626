"""The sealed attribution artifact: written append-only, reused when consistent, verified offline.

Owns ``runs/<experiment>/attributions/<inputs digest>-<id>/{attribution.json, COMPLETE}``:
the document names the exact attempts it was computed from (case id, attempt id and the
SHA-256 of each attempt's ``COMPLETE``), and ``COMPLETE`` seals it with the store's one seal
mechanism (``store.seal``: the attribution id and those inputs as header, the digest of
``attribution.json``, a MAC under an active seal key). Writing the
attribution of the same inputs again reuses a valid sealed one (a rerun that reuses every
attempt reuses its attribution too); otherwise a new directory is created; nothing is
overwritten. The document is decoded once, from the bytes the seal hashed, into its one type
(``attribution.document.Attribution``: the JSON path of what is wrong, the rules between its
members). ``verify_attribution`` re-checks the seal, checks that every named attempt is
still the one it names and is itself valid, recomputes the document from those attempts'
sealed tensors, and reports any difference. Knows nothing about engines or frontends.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from pytest_logprob_drift.attribution.analysis import (
    ATTRIBUTION_SCHEMA_VERSION,
    SealedExecution,
    as_recorded,
    attribute,
    load_execution,
)
from pytest_logprob_drift.attribution.document import (
    Attribution,
    Input,
    document_json,
    read_attribution_bytes,
)
from pytest_logprob_drift.check.resume import check_attempt
from pytest_logprob_drift.errors import StorageError
from pytest_logprob_drift.records import JsonObject, JsonValue, canonical_json, sha256_hex
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.attempt import Seal, new_attempt_id
from pytest_logprob_drift.store.decode import JSONDocumentError
from pytest_logprob_drift.store.files import (
    check_directory,
    json_bytes,
    make_directory,
    plain_name,
    publish_bytes,
    real_directory,
    sha256_file,
)
from pytest_logprob_drift.store.keys import active_key, sealing_with
from pytest_logprob_drift.store.seal import (
    FilesManifest,
    Manifest,
    Sealed,
    SealError,
    SealForm,
    new_manifest,
    read_manifest,
    verify_directory,
    write_manifest,
)


class AttributionSealDocument(FilesManifest, frozen=True, kw_only=True):
    """An attribution's ``COMPLETE`` as stored."""

    attribution_id: str
    inputs: tuple[Input, ...]


ATTRIBUTION_SEAL = SealForm(
    what="attribution seal",
    document=AttributionSealDocument,
    header=("attribution_id", "inputs"),
    covers=frozenset({layout.ATTRIBUTION}),
)
"""An attribution's COMPLETE: its id, the attempts it was computed from, its one document."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SealedAttribution:
    directory: Path
    document: Attribution
    reused: bool


def inputs_digest(document: Mapping[str, JsonValue]) -> str:
    return sha256_hex(
        canonical_json({"version": ATTRIBUTION_SCHEMA_VERSION, "inputs": document["inputs"]})
    )[:16]


def read_attribution(directory: Path) -> Attribution:
    """The sealed document (SealError naming the file at fault otherwise)."""
    return attribution_document(open_attribution(directory))


def open_attribution(directory: Path) -> Sealed:
    """The attribution's verified seal, with the bytes of ``attribution.json`` it hashed."""
    if not real_directory(directory) or not real_directory(directory.parent):
        raise SealError(layout.COMPLETE, "the attribution is not a directory: refused")
    manifest = _read_seal(directory)
    contents = verify_directory(directory, manifest, keep=(layout.ATTRIBUTION,))
    return Sealed(directory=directory, manifest=manifest, contents=contents)


def attribution_document(sealed: Sealed) -> Attribution:
    """The document in the verified bytes of ``attribution.json`` (never read again)."""
    try:
        document = read_attribution_bytes(sealed.contents[layout.ATTRIBUTION])
    except JSONDocumentError as exc:
        raise SealError(layout.ATTRIBUTION, str(exc)) from None
    if document_json(document)["inputs"] != sealed.manifest.header["inputs"]:
        raise SealError(layout.COMPLETE, "the seal and the document name different attempts")
    return document


def _read_seal(directory: Path) -> Manifest:
    """The attribution's parsed ``COMPLETE`` with its shape checked (its MAC is not)."""
    return read_manifest(
        directory / layout.COMPLETE,
        ATTRIBUTION_SEAL,
        name=layout.COMPLETE,
        missing="missing: the attribution was never sealed",
    )


def write_attribution(run_dir: Path, document: JsonObject) -> SealedAttribution:
    """Seal ``document`` (as ``attribute`` builds it) under the run, or reuse a valid sealed
    one of the same inputs; its record is decoded from the bytes written."""
    data = json_bytes(document)
    record = read_attribution_bytes(data)  # a writer's slip is refused before it is sealed
    digest = inputs_digest(document)
    root = run_dir / layout.ATTRIBUTIONS
    try:
        check_directory(root)  # never read or written through a symbolic link
    except OSError as exc:
        raise StorageError(root, "use it", exc) from None
    if root.is_dir():
        for existing in sorted(root.glob(f"{digest}-*"), reverse=True):
            try:
                if read_attribution(existing) == record:
                    return SealedAttribution(directory=existing, document=record, reused=True)
            except (SealError, OSError, ValueError):
                continue
    directory = root / f"{digest}-{new_attempt_id()}"
    try:
        make_directory(root)  # never through a symbolic link
        directory.mkdir()
    except OSError as exc:
        raise StorageError(directory, "create the attribution directory", exc) from None
    sha = publish_bytes(directory, layout.ATTRIBUTION, data)
    header = {"attribution_id": directory.name, "inputs": document["inputs"]}
    manifest = new_manifest(ATTRIBUTION_SEAL, header, {layout.ATTRIBUTION: sha})
    write_manifest(directory, layout.COMPLETE, manifest)
    return SealedAttribution(directory=directory, document=record, reused=False)


def attribution_dirs(run_dir: Path) -> list[Path]:
    """The run's attribution directories, oldest first (a StorageError when ``attributions/``
    is a symbolic link: what it points to is not this run's)."""
    root = run_dir / layout.ATTRIBUTIONS
    try:
        check_directory(root)
    except OSError as exc:
        raise StorageError(root, "read it", exc) from None
    return (
        sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.name)
        if root.is_dir()
        else []
    )


CheckedSeals = Mapping[tuple[str, str], Seal]
"""Seals a check of the run has just verified (``check.verify.verify_run``'s ``ok`` attempts),
by ``(case_id, attempt_id)``: an attempt among them is read from its seal, not checked again."""


def _execution_for(
    run_dir: Path, reference: Input, checked: CheckedSeals | None = None
) -> SealedExecution:
    if not (plain_name(reference.case_id) and plain_name(reference.attempt_id)):
        raise SealError(layout.ATTRIBUTION, "names an attempt outside the run's cases/; refused")
    attempt = run_dir / layout.CASES / reference.case_id / reference.attempt_id
    seal = (checked or {}).get((reference.case_id, reference.attempt_id))
    if seal is not None:  # checked just now: the COMPLETE it verified is the one to compare
        if str(seal.manifest.sha256) != reference.complete_sha256:
            raise SealError(
                layout.ATTRIBUTION,
                f"attempt {reference.attempt_id} is no longer the one it "
                "was computed from (its COMPLETE changed)",
            )
        return SealedExecution(attempt, seal)
    if not attempt.is_dir():
        raise SealError(
            layout.ATTRIBUTION,
            f"names attempt {reference.attempt_id} of case "
            f"{reference.case_id}, which does not exist",
        )
    try:
        complete: str | None = sha256_file(attempt / layout.COMPLETE)
    except OSError:  # missing, a link or not a regular file
        complete = None
    if complete != reference.complete_sha256:
        raise SealError(
            layout.ATTRIBUTION,
            f"attempt {reference.attempt_id} is no longer the one it "
            "was computed from (its COMPLETE changed)",
        )
    try:
        check_attempt(attempt, expected_key=None)
    except SealError as exc:
        raise SealError(
            layout.ATTRIBUTION,
            f"attempt {reference.attempt_id} it was computed from is invalid: {exc}",
        ) from None
    execution = load_execution(attempt)
    if execution.complete_sha256 != reference.complete_sha256:  # changed meanwhile
        raise SealError(
            layout.ATTRIBUTION,
            f"attempt {reference.attempt_id} is no longer the one it "
            "was computed from (its COMPLETE changed)",
        )
    return execution


def recompute(
    run_dir: Path, document: Attribution, checked: CheckedSeals | None = None
) -> dict[str, Any]:
    """The document recomputed from the attempts it names (the baseline's first: the
    document's rules hold)."""
    executions = [_execution_for(run_dir, r, checked) for r in document.inputs]
    repeats = document.noise_floor.repeats
    baseline, rest = executions[0], executions[1:]
    return attribute(document.experiment_id, baseline, rest[:repeats], rest[repeats:])


def differences(recorded: Any, recomputed: Any, path: str = "$") -> list[str]:
    """Where two documents differ (floats within 1e-9 relative count as equal: the bootstrap's
    float64 sums may round differently on another CPU)."""
    if isinstance(recorded, dict) and isinstance(recomputed, dict):
        found: list[str] = []
        for key in sorted(set(recorded) | set(recomputed)):
            found.extend(differences(recorded.get(key), recomputed.get(key), f"{path}.{key}"))
        return found
    if isinstance(recorded, list) and isinstance(recomputed, list):
        if len(recorded) != len(recomputed):
            return [f"{path}: {len(recorded)} items recorded, {len(recomputed)} recomputed"]
        return [
            d
            for i, (a, b) in enumerate(zip(recorded, recomputed, strict=True))
            for d in differences(a, b, f"{path}[{i}]")
        ]
    if (
        isinstance(recorded, float)
        and isinstance(recomputed, float)
        and math.isclose(recorded, recomputed, rel_tol=1e-9, abs_tol=1e-15)
    ):
        return []
    return (
        []
        if recorded == recomputed
        else [f"{path}: recorded {recorded!r}, recomputed {recomputed!r}"]
    )


def verify_attribution(
    run_dir: Path, directory: Path, checked: CheckedSeals | None = None
) -> list[str]:
    """Problems with one sealed attribution (empty when it is intact and reproducible);
    ``checked``: attempts a check of the run has just verified (``CheckedSeals``)."""
    try:
        document = read_attribution(directory)
        recomputed = read_attribution_bytes(json_bytes(recompute(run_dir, document, checked)))
    except SealError as exc:
        return [f"{exc.file}: {exc.message}"]
    except (KeyError, TypeError, ValueError) as exc:
        return [f"{layout.ATTRIBUTION}: malformed: {type(exc).__name__}: {exc}"]
    return differences(document_json(document), document_json(as_recorded(document, recomputed)))


class AttributionCheck(TypedDict):
    """One sealed attribution's check, as ``verify --json`` prints it."""

    attribution_id: str
    status: str
    problems: list[str]


def verify_attributions(run_dir: Path) -> list[AttributionCheck]:
    """Every sealed attribution's check: ``attribution_id``, ``status`` (``ok``, ``invalid`` or,
    under a seal key, ``superseded``: intact but sealed without the key, in a run that has an
    attribution sealed with it, as after a keyed resume) and ``problems`` (empty unless
    invalid)."""
    checked = [(d, verify_attribution(run_dir, d)) for d in attribution_dirs(run_dir)]
    keyed = active_key() is not None and any(not problems for _, problems in checked)
    results: list[AttributionCheck] = []
    for directory, problems in checked:
        status = "invalid" if problems else "ok"
        if problems and keyed and _intact_unkeyed(run_dir, directory):
            status, problems = "superseded", []
        results.append({"attribution_id": directory.name, "status": status, "problems": problems})
    return results


def _intact_unkeyed(run_dir: Path, directory: Path) -> bool:
    """Whether an attribution without a MAC verifies as a plain SHA-256 manifest."""
    try:
        if _read_seal(directory).mac is not None:
            return False
    except SealError:
        return False
    with sealing_with(None):
        return not verify_attribution(run_dir, directory)


def latest_attribution(run_dir: Path) -> Attribution | None:
    """The newest sealed attribution whose seal holds (None when there is none)."""
    for directory in sorted(
        attribution_dirs(run_dir), key=lambda p: p.name.split("-", 1)[-1], reverse=True
    ):
        try:
            return read_attribution(directory)
        except (SealError, OSError, ValueError):
            continue
    return None


def attribute_attempts(
    experiment_id: str, baseline: Path, repeats: Sequence[Path], cases: Sequence[Path]
) -> dict[str, Any]:
    """The attribution document of sealed attempt directories."""
    return attribute(
        experiment_id,
        load_execution(baseline),
        [load_execution(p) for p in repeats],
        [load_execution(p) for p in cases],
    )


def attribute_and_seal(
    run_dir: Path,
    experiment_id: str,
    baseline: Path,
    repeats: Sequence[Path],
    cases: Sequence[Path],
) -> SealedAttribution:
    """Compute the attribution of these sealed attempts and seal it (or reuse the sealed one)."""
    return write_attribution(run_dir, attribute_attempts(experiment_id, baseline, repeats, cases))
