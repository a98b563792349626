"""Importing a production run: each training step judged by the contract and sealed.

Owns turning the steps a format reader yields (``production.formats``) into a run the store
knows: each step's rows on one ``[B, T]`` token grid (padded to the step's longest row; at
most ``MAX_GRID_CELLS`` cells), judged by ``numerics.verdict.judge`` with the contract's one
rule on the active tokens (ZERO_ACTIVE_TOKENS, INVALID_ARTIFACT for a non-finite active score:
that step only), with the verdict's statistics and worst tokens and, for a judged step, the
importance-sampling figures (``comparison_record``: what each framework's correction
would clip), sealed as one attempt of a case per step (``store.attempt``): the
``score_rollout.pt``, ``score_training.pt``, ``comparison.json`` and ``token_diffs.pt`` an
executed attempt seals, plus the step's own document ``imported.json``
(``store.documents.ImportedStep`` v3: the source row of every grid row and the importing
environment; no requested, materialized, actual or identity document: nothing was planned,
materialized or read back), each written through the store's one attempt writer
(``AttemptWriter.write_document``). Logprobs are sealed in float32 when every value of the step
is one exactly (what a float32 trainer logged), else in float64; token ids in the narrowest of
``ID_DTYPES`` that holds the step's largest id; no ``position_ids`` (the grid determines them:
``check.sealed_tensors.grid_positions``). A case id is the hash of the format, the
step, the SHA-256 of the step's own source bytes and the contract version.

One step is held at a time. Everything is written under a temporary directory inside the
artifacts directory and published by one rename once every input was read to its end, with
``experiment.json`` (``store.documents.ImportSource``: the format, each input's SHA-256 and
size, the fields read) and ``plan.jsonl`` (one row per step, in step order) sealed by the
store; on any refusal or failure the temporary directory is removed and nothing is published
(and the staging directory of an import whose process was killed is removed by the next).
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec
import torch

from pytest_logprob_drift.check.imported_check import (
    imported_case_id,
    imported_key_payload,
    imported_label,
)
from pytest_logprob_drift.comparison_record import SCORED_OUTCOMES, comparison_of
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
from pytest_logprob_drift.numerics.gates import GateResult, gate_results
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
from pytest_logprob_drift.records import ResolvedContract, canonical, canonical_json
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.attempt import execution_key
from pytest_logprob_drift.store.decode import JSONDocumentError, decode
from pytest_logprob_drift.store.documents import (
    STEP_V3,
    ExperimentDocument,
    ImportedInput,
    ImportedStep,
    ImportSource,
)
from pytest_logprob_drift.store.files import fsync_dir, json_bytes, plain_name
from pytest_logprob_drift.store.run import ArtifactStore
from pytest_logprob_drift.tensorio import tensor_bytes

MAX_GRID_CELLS = 2**26
"""Most cells (samples x longest row) of one step's token grid (about 67 million: 512 samples
of 128k tokens), so rows of very different lengths cannot blow a step up. A step at this cap
peaks near 4 GiB resident (``benchmarks/bench_import_memory.py``); where that cannot be had,
the failed allocation is the command's one "out of memory" line naming the step."""
STEP_SCHEMA: Final = STEP_V3
"""The form of ``imported.json`` written: the step's own document set (v1 and v2, sealed by
earlier releases beside requested/materialized/actual/identity documents, are still read)."""


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
    positive: int = 0
    """Active logprobs above 0 on either side (a logprob is at most 0): judged as logged,
    and the command says so."""
    gates: tuple[GateResult, ...] = ()
    """The field's gates (``numerics.gates``) of a judged step (PASS or MISMATCH); empty
    otherwise."""

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


def environment_record() -> dict[str, str | None]:
    try:
        version: str | None = importlib.metadata.version("pytest-logprob-drift")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__),  # a str subclass: msgspec encodes plain strings only
        "pytest_logprob_drift": version,
    }


def _float32_exactly(values: torch.Tensor) -> torch.Tensor | None:
    """``values`` in float32 when every one is a float32 exactly (NaN and infinities
    included), else None."""
    narrowed = values.to(torch.float32)
    same = narrowed.to(torch.float64) == values
    if bool(same.all()) or bool(torch.isnan(values[~same]).all()):  # NaN narrows to NaN
        return narrowed
    return None


ID_DTYPES: Final = (torch.int16, torch.int32, torch.int64)
"""The dtypes an imported step's token ids are sealed in, narrowest first (signed: a reader
may pad a row with -1)."""


def narrowest_id_dtype(top: int) -> torch.dtype:
    """The narrowest of ``ID_DTYPES`` that holds every id from 0 to ``top`` exactly."""
    return next(d for d in ID_DTYPES if top <= torch.iinfo(d).max)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Grid:
    token_ids: torch.Tensor
    attention: torch.Tensor
    active: torch.Tensor
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
    lengths = torch.tensor([r.token_ids.numel() for r in rows], dtype=torch.int64)
    attention = torch.arange(width).expand(shape) < lengths.unsqueeze(1)

    cells = attention.reshape(-1).nonzero().squeeze(1)  # each row's cells, row after row

    def placed(dtype: torch.dtype, values: torch.Tensor) -> torch.Tensor:
        """The rows' concatenated ``values`` on the grid, 0 past each row's end: one
        indexed copy, no per-row copies."""
        grid = torch.zeros(shape, dtype=dtype)
        grid.view(-1).index_copy_(0, cells, values.to(dtype))
        return grid

    token_ids = placed(torch.int64, torch.cat([r.token_ids for r in rows]))
    token_ids = token_ids.to(narrowest_id_dtype(int(token_ids.max())))
    active = placed(torch.bool, torch.cat([r.active for r in rows]))
    rollout_values = torch.cat([r.rollout for r in rows])
    training_values = torch.cat([r.training for r in rows])
    rollout32, training32 = _float32_exactly(rollout_values), _float32_exactly(training_values)
    if rollout32 is not None and training32 is not None:  # padding's 0 is a float32 too
        rollout, training = placed(torch.float32, rollout32), placed(torch.float32, training32)
    else:
        rollout = placed(torch.float64, rollout_values)
        training = placed(torch.float64, training_values)
    masked = (
        placed(
            torch.bool,
            torch.cat(
                [
                    r.masked
                    if r.masked is not None
                    else torch.zeros(r.token_ids.numel(), dtype=torch.bool)
                    for r in rows
                ]
            ),
        )
        if any(r.masked is not None for r in rows)
        else None
    )
    starts = torch.tensor([r.start for r in rows], dtype=torch.int64)
    return _Grid(
        token_ids=token_ids,
        attention=attention,
        active=active,
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


class RunWriter:
    """The run being written under a temporary directory (a whole import, or one followed
    step: ``production.follow``)."""

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
        self.environment = environment_record()
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
        case_id = imported_case_id(
            fmt.name, step.step, step.digest, contract.source, contract.version
        )
        label = imported_label(step.step)
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
            format=fmt.name,
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
            input_digests=tuple(step.input_digests[i] for i in step.inputs),
            environment=self.environment,
        )
        check_decodes(imported, file_of(step.inputs[0]), f"step {step.step}: imported.json")
        attempt = self._write(case_id, grid, comparison, imported)
        case = ImportedCase(
            case_id=case_id,
            label=label,
            step=step.step,
            samples=len(step.rows),
            attempt=attempt,
            comparison=comparison,
            positive=int(((grid.rollout > 0) & grid.active).sum())
            + int(((grid.training > 0) & grid.active).sum()),
            gates=gate_results(
                grid.training,
                grid.rollout,
                grid.active,
                slime_figure=comparison.diagnostics.slime_train_rollout_logprob_abs_diff,
            )
            if verdict.outcome in (Outcome.PASS, Outcome.MISMATCH)
            else (),
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
        grid: _Grid,
        comparison: Comparison,
        imported: ImportedStep,
    ) -> str:
        contract = self.contract
        payload = imported_key_payload(
            imported, case_id, contract.source, contract.version, contract.threshold
        )
        writer = self.store.new_attempt(case_id, execution_key(payload))
        writer.write_document(imported)
        identity = {
            "token_ids": grid.token_ids,
            "attention_mask": grid.attention,
            "active_mask": grid.active,
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
            format=self.format.name,
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
        check_decodes(experiment, str(records[0].path) if records else "import", "experiment.json")
        order = sorted(range(len(self.rows)), key=lambda i: self.cases[i].step)
        self.store.initialize(experiment, [self.rows[i] for i in order])


ALLOCATION_FAILURES = ("can't allocate memory", "not enough memory", "out of memory")
"""What torch's CPU allocator says when an allocation fails (a RuntimeError, not MemoryError)."""


@contextlib.contextmanager
def _allocation_failure(step: int) -> Iterator[None]:
    """An allocation that fails while step ``step`` is judged or written is a MemoryError
    naming the step (the command's "out of memory" line), never a bug: torch reports it as a
    RuntimeError."""
    try:
        yield
    except RuntimeError as exc:
        if not any(marker in str(exc) for marker in ALLOCATION_FAILURES):
            raise
        raise MemoryError(
            f"step {step}: its token grid does not fit in the memory this process may use"
        ) from None
    except MemoryError:
        raise MemoryError(
            f"step {step}: its token grid does not fit in the memory this process may use"
        ) from None


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch at one intra-op thread while steps are read, judged and sealed (then as it was):
    each operation is on a few MB, where threads gain little, and on a busy machine torch's
    threads wait on each other (``benchmarks/bench_import.py``: an import of 10 steps beside
    other jobs took 18-20 s with two threads, 9.5-14.5 s with one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def check_decodes(document: object, file: str, what: str) -> None:
    """Refuse (an ``ImportInputError`` naming ``file``) a ``document`` the store's decoder
    would not read back (an id of 64 bits or more, a file name that is not UTF-8, ...):
    anything an import publishes verifies."""
    kind = ImportedStep if isinstance(document, ImportedStep) else ExperimentDocument
    try:
        decode(json_bytes(msgspec.to_builtins(document)), kind)
    except (JSONDocumentError, UnicodeError, ValueError) as exc:
        raise ImportInputError(
            file, f"{what} would not read back ({exc}); nothing is imported"
        ) from None


def default_experiment_id(fmt: str, records: Sequence[InputRecord]) -> str:
    """``import-<format>-<12 hex>``: the hash of the format and every input's SHA-256."""
    digest = hashlib.sha256(canonical_json([fmt, [r.sha256 for r in records]]).encode())
    return f"import-{fmt}-{digest.hexdigest()[:12]}"


def check_experiment_id(experiment_id: str) -> None:
    fault = experiment_id_fault(experiment_id)
    if fault is None and not plain_name(experiment_id):
        fault = "not a plain directory name (no '/', not hidden, not '.' or '..')"
    if fault is not None:
        raise UsageError(f"--experiment-id {experiment_id!r}: {fault}")


STAGING_PREFIX: Final = ".import-"
"""A staging directory is ``.import-<pid>-<16 hex>``: the importing process and a nonce."""


def remove_abandoned_staging(artifacts: Path) -> None:
    """Remove the staging directories of imports whose process no longer runs (killed before
    they could clean up); never one of a running import, never anything else."""
    for entry in os.scandir(artifacts):
        name = entry.name
        if not name.startswith(STAGING_PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        pid, _, nonce = name[len(STAGING_PREFIX) :].partition("-")
        if not (pid.isdigit() and len(nonce) == 16 and int(pid) > 0):
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(entry.path, ignore_errors=True)
        except (PermissionError, OverflowError):  # another user's live process / no pid
            continue


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
        check_experiment_id(experiment_id)
        if os.path.lexists(artifacts / experiment_id):
            raise _exists(artifacts / experiment_id)
    try:
        artifacts.mkdir(parents=True, exist_ok=True)
        remove_abandoned_staging(artifacts)
        staging = artifacts / f"{STAGING_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
        staging.mkdir()
    except OSError as exc:
        raise StorageError(artifacts, "create a directory to import into", exc) from None
    try:
        run = RunWriter(form, contract, staging, worst)
        opened: list[InputFile] = []
        try:
            with one_thread():
                for step in READERS[fmt](files, opened):
                    with _allocation_failure(step.step):
                        run.add(step, opened)
                    del step
        finally:
            for file in opened:
                file.close()
        records = [file.record() for file in opened]
        name = experiment_id or default_experiment_id(fmt, records)
        check_experiment_id(name)
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
