"""Importing a production run: each training step judged by the contract and sealed.

Owns turning the steps a format reader yields (``production.formats``) into a run the store
knows: each step's rows on one ``[B, T]`` token grid (padded to the step's longest row; at
most ``MAX_GRID_CELLS`` cells), judged by ``numerics.verdict.judge`` with the contract's one
rule on the active tokens (ZERO_ACTIVE_TOKENS, INVALID_ARTIFACT for a non-finite active score:
that step only), with the verdict's statistics and worst tokens and, for a judged step, the
importance-sampling figures (``store.importance_check``: what each framework's correction
would clip), sealed as one attempt of a case per step (``store.attempt``): what an executed
attempt seals (requested/materialized/actual/identity documents, saying the step was imported
and no engine ran, ``score_rollout.pt``, ``score_training.pt``, ``comparison.json``,
``token_diffs.pt``) plus ``imported.json`` (``store.documents.ImportedStep``: the source row of
every grid row). Logprobs are sealed in float32 when every value of the step is one exactly
(what a float32 trainer logged), else in float64. A case id is the hash of the format, the
step, the SHA-256 of the step's own source bytes and the contract version.

One step is held at a time. Everything is written under a temporary directory inside the
artifacts directory and published by one rename once every input was read to its end, with
``experiment.json`` (``store.documents.ImportSource``: the format, each input's SHA-256 and
size, the fields read) and ``plan.jsonl`` (one row per step, in step order) sealed by the
store; on any refusal or failure the temporary directory is removed and nothing is published.
An existing run directory is never written into. With ``import --worst K``, each judged step's
grid is also handed to ``production.worst.WorstSamples`` (the run's K worst samples and their
logged prompts). Knows nothing about engines or frontends.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import platform
import secrets
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec
import torch

from pytest_logprob_drift.config.limits import experiment_id_fault
from pytest_logprob_drift.errors import StorageError, UsageError
from pytest_logprob_drift.numerics.comparison import (
    Comparison,
)
from pytest_logprob_drift.numerics.framework_figures import (
    MASKED_BY_RUN,
    masked_by_run,
    slime_figures,
)
from pytest_logprob_drift.numerics.verdict import Verdict, judge
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.production.formats import FORMATS, READERS, Format, Row, Step
from pytest_logprob_drift.production.sources import (
    MAX_INPUT_BYTES,
    ImportInputError,
    InputFile,
    InputRecord,
    input_paths,
)
from pytest_logprob_drift.production.worst import WorstSamples
from pytest_logprob_drift.records import ResolvedContract, canonical, canonical_json, sha256_hex
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.attempt import execution_key
from pytest_logprob_drift.store.documents import (
    ImportedInput,
    ImportedStep,
    ImportSource,
)
from pytest_logprob_drift.store.files import fsync_dir, plain_name
from pytest_logprob_drift.store.importance_check import SCORED_OUTCOMES, comparison_of
from pytest_logprob_drift.store.run import ArtifactStore
from pytest_logprob_drift.tensorio import tensor_bytes

MAX_GRID_CELLS = 2**26
"""Most cells (samples x longest row) of one step's token grid (about 67 million: 512 samples
of 128k tokens), so rows of very different lengths cannot blow a step up."""
STEP_SCHEMA: Final = "cross_config.imported_step.v1"
IMPORT_SCHEMA: Final = "cross_config.import.v1"
IMPORTED_SIDE = {
    "source": "imported",
    "engine": None,
    "identity": "one logged record holds both sides' token ids, masks and positions; no "
    "engine ran here and nothing could be checked beyond that record",
}
"""What identity.json records for each side of an imported step (the same on both: there is
one record, so the identity tensors are equal by construction)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportedCase:
    """One imported step as the command shows it."""

    case_id: str
    label: str
    step: int
    samples: int
    attempt: str
    """The attempt's directory relative to the run directory."""
    comparison: Comparison

    @property
    def outcome(self) -> Outcome:
        return self.comparison.outcome


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportResult:
    run_dir: Path
    experiment_id: str
    format: str
    inputs: tuple[InputRecord, ...]
    cases: tuple[ImportedCase, ...]


def _environment() -> dict[str, str | None]:
    try:
        version: str | None = importlib.metadata.version("pytest-logprob-drift")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "pytest_logprob_drift": version,
    }


def _lossless_float32(values: torch.Tensor) -> bool:
    """Whether every value is a float32 exactly (NaN and infinities included)."""
    narrowed = values.to(torch.float32).to(torch.float64)
    return bool(((narrowed == values) | (torch.isnan(values) & torch.isnan(narrowed))).all())


@dataclass(frozen=True, slots=True, kw_only=True)
class _Grid:
    token_ids: torch.Tensor
    attention: torch.Tensor
    active: torch.Tensor
    positions: torch.Tensor
    rollout: torch.Tensor
    training: torch.Tensor
    starts: torch.Tensor
    masked: torch.Tensor | None
    """The tokens the run masked itself (``Row.masked``); None when no row has any."""


def _grid(step: Step, file_of: Callable[[int], str]) -> _Grid:
    rows: Sequence[Row] = step.rows
    width = max(r.token_ids.numel() for r in rows)
    if len(rows) * width > MAX_GRID_CELLS:
        raise ImportInputError(
            file_of(step.inputs[0]),
            f"step {step.step}: {len(rows)} samples of up to {width} tokens make a token grid "
            f"of {len(rows) * width} cells, more than the {MAX_GRID_CELLS} one step may have",
        )
    shape = (len(rows), width)
    token_ids = torch.zeros(shape, dtype=torch.int64)
    attention = torch.zeros(shape, dtype=torch.bool)
    active = torch.zeros(shape, dtype=torch.bool)
    rollout = torch.zeros(shape, dtype=torch.float64)
    training = torch.zeros(shape, dtype=torch.float64)
    masked = None
    for i, row in enumerate(rows):
        n = row.token_ids.numel()
        token_ids[i, :n] = row.token_ids
        attention[i, :n] = True
        active[i, :n] = row.active
        rollout[i, :n] = row.rollout
        training[i, :n] = row.training
        if row.masked is not None:
            masked = torch.zeros(shape, dtype=torch.bool) if masked is None else masked
            masked[i, :n] = row.masked
    if _lossless_float32(rollout) and _lossless_float32(training):
        rollout, training = rollout.to(torch.float32), training.to(torch.float32)
    positions = torch.arange(width, dtype=torch.int64).expand(shape) * attention
    starts = torch.tensor([r.start for r in rows], dtype=torch.int64)
    return _Grid(
        token_ids=token_ids,
        attention=attention,
        active=active,
        positions=positions.contiguous(),
        rollout=rollout,
        training=training,
        starts=starts,
        masked=masked,
    )


def _comparison(
    case_id: str,
    label: str,
    contract: ResolvedContract,
    verdict: Verdict,
    grid: _Grid,
    figures: dict[str, Any],
) -> Comparison:
    """comparison.json's record, as ``execute.case`` builds it for an executed case: the
    verdict, its statistics, the importance-sampling figures of a judged step, the re-check,
    the framework's own ``figures`` (``numerics.framework_figures``); no knob records (nothing
    was configured)."""
    return comparison_of(
        verdict,
        case_id=case_id,
        label=label,
        contract=contract,
        scores=(grid.training, grid.rollout, grid.active),
        entries=figures,
        numerical=verdict.numeric_check(),
    )


class _Run:
    """The run being written under a temporary directory."""

    def __init__(
        self,
        fmt: Format,
        contract: ResolvedContract,
        staging: Path,
        worst: WorstSamples | None = None,
    ) -> None:
        self.format = fmt
        self.worst = worst
        self.contract = contract
        self.store = ArtifactStore(staging, "run")
        self.environment = _environment()
        self.cases: list[ImportedCase] = []
        self.rows: list[dict[str, Any]] = []
        self.steps: dict[int, str] = {}
        self.samples = 0

    def add(self, step: Step, opened: Sequence[InputFile]) -> ImportedCase:
        fmt, contract = self.format, self.contract

        def file_of(index: int) -> str:
            return str(opened[index].path)

        if step.step in self.steps:
            raise ImportInputError(
                file_of(step.inputs[0]), f"step {step.step} again (also in {self.steps[step.step]})"
            )
        self.steps[step.step] = file_of(step.inputs[0])
        grid = _grid(step, file_of)
        case_id = sha256_hex(
            canonical_json(
                {
                    "schema": STEP_SCHEMA,
                    "format": fmt.name,
                    "step": step.step,
                    "rows_sha256": step.digest,
                    "contract": {"source": contract.source, "version": contract.version},
                }
            )
        )[:16]
        label = f"step={step.step}"
        verdict = judge(grid.training, grid.rollout, grid.active, contract.threshold)
        figures = (
            slime_figures(grid.training, grid.rollout, grid.active, step.slime)
            if step.slime is not None and verdict.outcome in SCORED_OUTCOMES
            else {}
        )
        if grid.masked is not None:
            figures[MASKED_BY_RUN] = masked_by_run(
                grid.training, grid.rollout, grid.masked, contract.threshold
            )
        comparison = _comparison(case_id, label, contract, verdict, grid, figures)
        if self.worst is not None and verdict.outcome in SCORED_OUTCOMES:
            self.worst.add(
                step=step.step,
                case_id=case_id,
                training=grid.training,
                rollout=grid.rollout,
                active=grid.active,
                threshold=contract.threshold,
                token_ids=grid.token_ids,
                starts=grid.starts,
                sources=[r.source for r in step.rows],
            )
        imported = ImportedStep(
            schema_version=STEP_SCHEMA,
            format=fmt.name,  # type: ignore[arg-type]
            step=step.step,
            inputs=tuple(file_of(i) for i in step.inputs),
            rows_sha256=step.digest,
            rollout_logprobs=fmt.rollout,
            training_logprobs=fmt.training,
            active=fmt.active,
            logprob_dtype="float32" if grid.rollout.dtype == torch.float32 else "float64",
            samples=len(step.rows),
            rows=tuple(
                msgspec.structs.replace(r.source, input=step.inputs.index(r.source.input))
                for r in step.rows
            ),
        )
        attempt = self._write(case_id, label, step, grid, comparison, imported)
        case = ImportedCase(
            case_id=case_id,
            label=label,
            step=step.step,
            samples=len(step.rows),
            attempt=attempt,
            comparison=comparison,
        )
        self.cases.append(case)
        self.samples += len(step.rows)
        self.rows.append(
            {
                "case_id": case_id,
                "label": label,
                "kind": "imported",
                "changed": [],
                "lifecycle": None,
                "requested": {},
                "operators": [],
                "scenario_level": "imported",
                "device": "none",
                "executable_by": [],
                "contract_version": contract.version,
                "threshold": contract.threshold,
            }
        )
        return case

    def _write(
        self,
        case_id: str,
        label: str,
        step: Step,
        grid: _Grid,
        comparison: Comparison,
        imported: ImportedStep,
    ) -> str:
        fmt, contract = self.format, self.contract
        source = {"format": fmt.name, "step": step.step, "rows_sha256": step.digest}
        payload: dict[str, Any] = {
            "version": IMPORT_SCHEMA,
            "case_id": case_id,
            "identity": {"imported": source},
            "materialization": {},
            "requested": {},
            "scorer": None,
            "operators": [],
            "runtime": f"import:{fmt.name}",
            "fingerprints": {},
            "contract": {
                "source": contract.source,
                "version": contract.version,
                "threshold": contract.threshold,
            },
            "environment": self.environment,
        }
        writer = self.store.new_attempt(case_id, execution_key(payload))
        writer.write_json(
            layout.REQUESTED,
            {
                "case_id": case_id,
                "label": label,
                "knobs": {},
                "changed": [],
                "binding": {"imported": source},
            },
        )
        writer.write_json(layout.MATERIALIZED, {"knobs": {}, "operators": []})
        writer.write_json(
            layout.ACTUAL,
            {"knobs": {}, "read_back": None, "operator_provenance": [], "training_evidence": None},
        )
        writer.write_json(
            layout.IDENTITY,
            {
                "identity": {"imported": source},
                "rollout": {**IMPORTED_SIDE, "format": fmt.name},
                "training": {**IMPORTED_SIDE, "format": fmt.name},
                "execution_key_payload": payload,
            },
        )
        writer.write_json(layout.IMPORTED, msgspec.to_builtins(imported))
        identity = {
            "token_ids": grid.token_ids,
            "attention_mask": grid.attention,
            "active_mask": grid.active,
            "position_ids": grid.positions,
        }
        writer.write_bytes(
            layout.SCORE_ROLLOUT,
            tensor_bytes({**identity, "logprobs": grid.rollout, "prompt_lengths": grid.starts}),
        )
        writer.write_bytes(
            layout.SCORE_TRAINING, tensor_bytes({**identity, "logprobs": grid.training})
        )
        writer.write_json(layout.COMPARISON, comparison.to_json())
        writer.write_bytes(
            layout.TOKEN_DIFFS,
            tensor_bytes(
                {
                    "training_logprobs": grid.training,
                    "rollout_logprobs": grid.rollout,
                    "active_mask": grid.active,
                    "threshold": torch.tensor(contract.threshold, dtype=torch.float64),
                }
            ),
        )
        seal = writer.seal()
        return f"{layout.CASES}/{case_id}/{seal.attempt_id}"

    def finish(self, experiment_id: str, records: Sequence[InputRecord]) -> None:
        source = ImportSource(
            schema_version=IMPORT_SCHEMA,
            format=self.format.name,  # type: ignore[arg-type]
            inputs=tuple(ImportedInput(path=r.path, sha256=r.sha256, size=r.size) for r in records),
            fields=self.format.fields,
            steps=len(self.cases),
            samples=self.samples,
            max_input_bytes=MAX_INPUT_BYTES,
        )
        experiment = {
            "experiment_id": experiment_id,
            "scenario_id": f"import:{self.format.name}",
            "scenario": {"level": "imported", "format": self.format.name},
            "contract": canonical(self.contract),
            "strategy": "import",
            "strict_fallback": False,
            "identity": {},
            "imported": msgspec.to_builtins(source),
        }
        order = sorted(range(len(self.rows)), key=lambda i: self.cases[i].step)
        self.store.initialize(experiment, [self.rows[i] for i in order])


def default_experiment_id(fmt: str, records: Sequence[InputRecord]) -> str:
    """``import-<format>-<12 hex>``: the hash of the format and every input's SHA-256."""
    digest = hashlib.sha256(canonical_json([fmt, [r.sha256 for r in records]]).encode())
    return f"import-{fmt}-{digest.hexdigest()[:12]}"


def _check_experiment_id(experiment_id: str) -> None:
    fault = experiment_id_fault(experiment_id)
    if fault is None and not plain_name(experiment_id):
        fault = "not a plain directory name (no '/', not hidden, not '.' or '..')"
    if fault is not None:
        raise UsageError(f"--experiment-id {experiment_id!r}: {fault}")


def _exists(target: Path) -> UsageError:
    return UsageError(
        f"{target}: a run directory of that name exists; an import never writes into one "
        "(give another --experiment-id or --artifacts)"
    )


def import_run(
    fmt: str,
    paths: Sequence[str],
    *,
    artifacts: Path,
    contract: ResolvedContract,
    experiment_id: str | None = None,
    worst: WorstSamples | None = None,
) -> ImportResult:
    """Import ``paths`` of format ``fmt`` as a sealed run under ``artifacts`` (an
    ``ImportInputError``/``UsageError`` for bad input, nothing published); ``worst``, when
    given, collects the worst samples of the judged steps (``production.worst``)."""
    form = FORMATS[fmt]
    files = input_paths(fmt, list(paths))
    for path in files:  # refuse what can be refused before anything is read
        InputFile(path).close()
    if experiment_id is not None:
        _check_experiment_id(experiment_id)
        if os.path.lexists(artifacts / experiment_id):
            raise _exists(artifacts / experiment_id)
    try:
        artifacts.mkdir(parents=True, exist_ok=True)
        staging = artifacts / f".import-{secrets.token_hex(8)}"
        staging.mkdir()
    except OSError as exc:
        raise StorageError(artifacts, "create a directory to import into", exc) from None
    try:
        run = _Run(form, contract, staging, worst)
        opened: list[InputFile] = []
        try:
            for step in READERS[fmt](files, opened):
                run.add(step, opened)
                del step
        finally:
            for file in opened:
                file.close()
        records = [file.record() for file in opened]
        name = experiment_id or default_experiment_id(fmt, records)
        _check_experiment_id(name)
        run.finish(name, records)
        target = artifacts / name
        try:
            os.mkdir(target)
        except FileExistsError:
            raise _exists(target) from None
        except OSError as exc:
            raise StorageError(target, "create the run directory", exc) from None
        try:
            os.rename(run.store.directory, target)
            fsync_dir(artifacts)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.rmdir(target)
            raise StorageError(target, "publish the imported run", exc) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    cases = tuple(sorted(run.cases, key=lambda c: c.step))
    return ImportResult(
        run_dir=target, experiment_id=name, format=fmt, inputs=tuple(records), cases=cases
    )
