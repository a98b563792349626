"""Following a live run's log directory: each step sealed as soon as its file is complete.

Owns ``import --follow``: polling one directory (no inotify), deciding per format when a step's
files are complete (never judging a file still being written), sealing each complete step
into a run that grows step by step, and telling the caller, once per step and once when a
signature or a gate is first crossed. A step is complete:

- NeMo-RL ``train_data_step<N>.jsonl``: when a later step's file exists, or its size has not
  changed for ``settle`` seconds, it ends with a newline and every line decodes as JSON;
- slime ``.pt`` (``<rollout_id>.pt`` or per rank ``<rollout_id>_<rank>.pt``): when each file's
  zip end-of-central-directory record is present (``zipfile`` opens it) and its size did not
  change since the previous poll; for the per-rank layout, when the step has every rank: the
  ranks ``0..k-1`` of the first step sealed, or, before one was, ranks ``0..k-1`` of its own
  once a later rollout's file exists or (the newest rollout) none of its files changed for
  ``settle`` seconds (a dump names no world size; so a run of one rollout is sealed too; a
  later rollout's rank beyond the count of the first sealed is refused);
- neutral JSONL (``*.jsonl``/``*.ndjson``, one growing file or one file per step, each scanned
  to its last whole line as it grows): a step's lines are complete when a whole line of
  another step follows them in their file or another file holds a later step; the newest
  step once its file has not changed for ``settle`` seconds and ends with a newline. Only
  its own lines are read (``formats.read_neutral_span``); a step's lines after another
  step's are refused.

Each step is judged and written by ``production.importer`` under a staging directory in the
artifacts directory, then its case directory is renamed into the run's ``cases/`` and its plan
row appended under a new run seal (``store.run.ArtifactStore.initialize``). A step whose case
is already in the run (the same format, step, bytes and contract) is never rewritten, so
following the same directory again adds only the steps not yet sealed. ``experiment.json``'s
``imported`` is ``store.documents.FollowedImportSource`` (no whole-run counts): each step's
``imported.json`` (v2) holds its inputs' SHA-256.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import re
import secrets
import shutil
import signal
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Final

import msgspec

from pytest_logprob_drift.errors import StorageError, UsageError
from pytest_logprob_drift.numerics.gates import GATE_BY_KEY
from pytest_logprob_drift.numerics.signature_record import SignatureId
from pytest_logprob_drift.numerics.signatures import run_signatures
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.production.formats import FORMATS, READERS, read_neutral_span
from pytest_logprob_drift.production.importer import (
    STAGING_PREFIX,
    ImportedCase,
    RunWriter,
    check_decodes,
    check_experiment_id,
    environment_record,
    remove_abandoned_staging,
)
from pytest_logprob_drift.production.sources import (
    MAX_INPUT_BYTES,
    MAX_LINE_BYTES,
    NEMO_RL_NAME,
    ImportInputError,
    InputFile,
)
from pytest_logprob_drift.records import ResolvedContract, canonical
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.decode import JSONDocumentError, decode
from pytest_logprob_drift.store.documents import ExperimentDocument, FollowedImportSource
from pytest_logprob_drift.store.files import fsync_dir
from pytest_logprob_drift.store.run import ArtifactStore, read_plan_log

NEUTRAL_SUFFIXES: Final = (".jsonl", ".ndjson")
SLIME_NAME = re.compile(r"([0-9]+)(?:_([0-9]+))?\.pt")
"""slime's ``<rollout_id>.pt`` (format_version 2) or ``<rollout_id>_<rank>.pt``."""
ANY: Final = "any"
"""``--exit-on any``: every signature and gate."""
NAMES: Final = frozenset({s.value for s in SignatureId} | set(GATE_BY_KEY))
"""What ``--exit-on`` may name: a signature id or a gate key."""


def exit_on_names(text: str | None) -> frozenset[str]:
    """``--exit-on``'s comma-separated names (a ``UsageError`` naming an unknown one)."""
    if text is None:
        return frozenset()
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise UsageError("--exit-on: no name given")
    if ANY in names:
        return NAMES
    unknown = sorted(names - NAMES)
    if unknown:
        signatures = ", ".join(s.value for s in SignatureId)
        raise UsageError(
            f"--exit-on: {unknown[0]!r} is neither a signature ({signatures}) nor a gate "
            f"({', '.join(GATE_BY_KEY)}), nor 'any'"
        )
    return names


@dataclass(frozen=True, slots=True, kw_only=True)
class Crossing:
    """A signature or gate first crossed at ``step`` in this follow."""

    name: str
    kind: str
    """``signature`` or ``gate``."""
    step: int
    detail: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FollowedStep:
    """One complete step as the follower handled it."""

    case: ImportedCase
    sealed: bool
    """False: the run held the step already (nothing written)."""
    crossings: tuple[Crossing, ...]


@dataclass(slots=True)
class _Seen:
    size: int
    mtime: int
    since: float


@dataclass(slots=True)
class _Watch:
    """What the polls saw of each file: its size and since when it has not changed."""

    files: dict[Path, _Seen] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)
    """The steps handled: never looked at again (nor their files read)."""

    def update(self, paths: Sequence[Path], now: float) -> None:
        for path in paths:
            try:
                st = os.stat(path)
            except OSError:
                self.files.pop(path, None)
                continue
            seen = self.files.get(path)
            if seen is None or (seen.size, seen.mtime) != (st.st_size, st.st_mtime_ns):
                self.files[path] = _Seen(size=st.st_size, mtime=st.st_mtime_ns, since=now)

    def unchanged_for(self, path: Path, now: float) -> float:
        seen = self.files.get(path)
        return -1.0 if seen is None else now - seen.since

    def polled_twice(self, path: Path, now: float) -> bool:
        """Unchanged since a poll before this one."""
        return self.unchanged_for(path, now) > 0.0


def _listing(directory: Path) -> list[Path]:
    try:
        return [directory / n for n in os.listdir(directory)]
    except OSError as exc:
        raise ImportInputError(directory, f"cannot list it: {exc.strerror or exc}") from None


def _nemo_decodes_whole(path: Path) -> bool:
    """The file ends with a newline and every line is one JSON value (a JSONL step file)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return False
            f.seek(size - 1)
            if f.read(1) != b"\n":  # checked before the whole file is read
                return False
            f.seek(0)
            data = f.read()
    except OSError:
        return False
    try:
        for line in data.splitlines():
            if line.strip():
                msgspec.json.decode(line)
    except msgspec.DecodeError:
        return False
    return True


@dataclass(frozen=True, slots=True, kw_only=True)
class _Ready:
    """A complete step: its files and, for a neutral file's step, the span of its lines
    (``(start, stop, first line number)``)."""

    step: int
    paths: list[Path]
    span: tuple[int, int, int] | None = None


def _nemo_ready(directory: Path, watch: _Watch, settle: float, now: float) -> list[_Ready]:
    steps = {
        int(m.group(1)): p
        for p in _listing(directory)
        if (m := NEMO_RL_NAME.fullmatch(p.name)) is not None and p.is_file()
    }
    watch.update(list(steps.values()), now)
    last = max(steps, default=None)
    ready = []
    for step, path in sorted(steps.items()):
        if step in watch.done:
            continue
        if step != last or (watch.unchanged_for(path, now) >= settle and _nemo_decodes_whole(path)):
            ready.append(_Ready(step=step, paths=[path]))
    return ready


class _StepOnly(msgspec.Struct):
    step: int


@dataclass(slots=True)
class _Segment:
    """The lines of one step in a neutral file: bytes ``[start, stop)`` from line ``first``."""

    step: int
    start: int
    stop: int
    first: int


@dataclass(slots=True)
class _NeutralFile:
    """How far a neutral file was scanned (to the end of its last whole line), its steps'
    segments in file order, and whether a partial line follows."""

    identity: tuple[int, int]
    offset: int = 0
    size: int = 0
    """The file's size when last scanned (a partial line is not read again until it grows)."""
    lines: int = 0
    tail: bool = False
    segments: list[_Segment] = field(default_factory=list)


@dataclass(slots=True)
class _NeutralScan:
    """Every neutral file of the directory, scanned as it grows; where each step began."""

    files: dict[Path, _NeutralFile] = field(default_factory=dict)
    began: dict[int, str] = field(default_factory=dict)

    def scan(self, path: Path) -> None:
        """Read the whole lines appended to ``path`` since the last scan into segments."""
        try:
            st = os.stat(path)
        except OSError:
            return
        identity = (st.st_dev, st.st_ino)
        state = self.files.setdefault(path, _NeutralFile(identity=identity))
        if state.identity != identity or st.st_size < state.offset:
            raise ImportInputError(
                path, "replaced or cut while followed (a followed file only grows)"
            )
        if st.st_size in (state.offset, state.size):
            return
        state.size = st.st_size
        pending = bytearray()
        position = state.offset
        try:
            with open(path, "rb") as f:
                f.seek(state.offset)
                while chunk := f.read(1 << 20):
                    pending += chunk
                    while (end := pending.find(b"\n")) >= 0:
                        line = bytes(pending[: end + 1])
                        del pending[: end + 1]
                        self._line(path, state, line, position)
                        position += len(line)
                    if len(pending) > MAX_LINE_BYTES:
                        raise ImportInputError(
                            path, f"line longer than {MAX_LINE_BYTES} bytes", line=state.lines + 1
                        )
        except OSError as exc:
            raise ImportInputError(path, f"cannot read it: {exc.strerror or exc}") from None
        state.offset, state.tail = position, bool(pending)

    def _line(self, path: Path, state: _NeutralFile, line: bytes, position: int) -> None:
        state.lines += 1
        stop = position + len(line)
        current = state.segments[-1] if state.segments else None
        if not line.strip():
            if current is not None:
                current.stop = stop
            return
        step = _line_step(line)
        if current is not None and (step is None or step == current.step):
            current.stop = stop  # a line naming no step: the reader refuses it when sealed
            return
        if step is None:
            _refuse_line(path, (position, stop, state.lines))
            raise ImportInputError(path, "names no step", line=state.lines)
        if step in self.began:
            raise ImportInputError(
                path,
                f"step {step} again, after other steps (first at {self.began[step]}): write "
                "each step's samples together",
                line=state.lines,
            )
        self.began[step] = f"{path}:{state.lines}"
        state.segments.append(_Segment(step=step, start=position, stop=stop, first=state.lines))


def _line_step(line: bytes) -> int | None:
    """The step a neutral line names (None: not a JSON object with an integer step)."""
    try:
        return msgspec.json.decode(line, type=_StepOnly).step
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _refuse_line(path: Path, span: tuple[int, int, int]) -> None:
    """The neutral reader's own refusal of one line (what is wrong with it)."""
    opened: list[InputFile] = []
    try:
        for _ in read_neutral_span(path, span, opened):
            pass
    finally:
        for file in opened:
            file.close()


def _neutral_ready(
    directory: Path, watch: _Watch, scan: _NeutralScan, settle: float, now: float
) -> list[_Ready]:
    """Each neutral file's steps (a file may hold many, growing): a step is complete once a
    line of another step follows it in its file or another file holds a later step; the
    newest once its file has not changed for ``settle`` seconds and ends with a newline."""
    files = sorted(
        p for p in _listing(directory) if p.suffix.lower() in NEUTRAL_SUFFIXES and p.is_file()
    )
    watch.update(files, now)
    for path in files:
        scan.scan(path)
    latest = {
        path: max((s.step for s in state.segments), default=-1)
        for path, state in scan.files.items()
    }
    ready = []
    for path, state in scan.files.items():
        later_elsewhere = max((v for p, v in latest.items() if p != path), default=-1)
        for number, segment in enumerate(state.segments):
            if segment.step in watch.done:
                continue
            complete = (
                number + 1 < len(state.segments)
                or later_elsewhere > segment.step
                or (not state.tail and watch.unchanged_for(path, now) >= settle)
            )
            if complete:
                span = (segment.start, segment.stop, segment.first)
                ready.append(_Ready(step=segment.step, paths=[path], span=span))
    return sorted(ready, key=lambda r: r.step)


def _zip_whole(path: Path) -> bool:
    """The zip's end-of-central-directory record is present and its directory reads."""
    try:
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
    except (OSError, zipfile.BadZipFile, ValueError):
        return False
    return True


def _slime_ready(
    directory: Path, watch: _Watch, settle: float, now: float, ranks: list[int]
) -> list[_Ready]:
    """``ranks``: the rank count of the first per-rank step sealed (empty before; filled
    here). A per-rank step is complete when each of its files is whole and its ranks are
    every rank: ``0..k-1`` of that count once known; before, ``0..k-1`` of its own once a
    later rollout's file appeared or (a run's newest rollout) none of its files changed for
    ``settle`` seconds (a dump names no world size)."""
    if (directory / "train_data").is_dir():  # a --dump-details directory
        directory = directory / "train_data"
    groups: dict[int, dict[int | None, Path]] = {}
    for path in _listing(directory):
        match = SLIME_NAME.fullmatch(path.name)
        if match is None or not path.is_file():
            continue
        rank = None if match.group(2) is None else int(match.group(2))
        groups.setdefault(int(match.group(1)), {})[rank] = path
    watch.update([p for g in groups.values() for p in g.values()], now)
    last = max(groups, default=None)
    ready: list[_Ready] = []
    for step, files in sorted(groups.items()):
        if step in watch.done:
            continue
        paths = [files[r] for r in sorted(files, key=lambda r: -1 if r is None else r)]
        if not all(watch.polled_twice(p, now) and _zip_whole(p) for p in paths):
            continue
        if None not in files:  # per rank
            count = ranks[0] if ranks else len(files)
            beyond = max(r for r in files if r is not None)
            if ranks and beyond >= count:
                if ready:  # sealed first; refused at the next poll
                    break
                raise ImportInputError(
                    files[beyond],
                    f"rank {beyond} of rollout {step}, where the first rollout sealed had "
                    f"{count} rank(s) (ranks 0..{count - 1}): follow the run with a --settle "
                    "longer than its ranks' dumps take to appear, into another --experiment-id",
                )
            if set(files) != set(range(count)):
                continue
            settled = all(watch.unchanged_for(p, now) >= settle for p in paths)
            if not ranks and step == last and not settled:
                continue
            if not ranks:
                ranks.append(count)
        ready.append(_Ready(step=step, paths=paths))
    return ready


class _Stop:
    """SIGINT/SIGTERM ask the follower to stop between steps (the step being sealed is
    finished first); the previous handlers come back on exit."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self.signal = signum

    @contextlib.contextmanager
    def installed(self) -> Iterator[_Stop]:
        previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


@dataclass(frozen=True, slots=True, kw_only=True)
class FollowResult:
    run_dir: Path
    experiment_id: str
    steps: tuple[FollowedStep, ...]
    stopped_by: str
    """``idle``, ``SIGINT``, ``SIGTERM`` or ``exit-on``."""


def _seconds(option: str, value: float, *, zero: bool) -> None:
    """A finite number of seconds, above 0 (or at least 0 with ``zero``)."""
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise UsageError(
            f"{option} {value}: must be a number of seconds {'at least' if zero else 'above'} 0"
        )


def default_follow_id(fmt: str, directory: Path) -> str:
    """``follow-<format>-<12 hex>``: the hash of the format and the directory's real path."""
    digest = hashlib.sha256(f"{fmt}\0{os.path.realpath(directory)}".encode())
    return f"follow-{fmt}-{digest.hexdigest()[:12]}"


class _Crossings:
    """Which signatures and gates were crossed so far, and the run scope figures."""

    def __init__(self) -> None:
        self.crossed: set[str] = set()
        self.figures: dict[int, float] = {}

    def add(self, case: ImportedCase) -> tuple[Crossing, ...]:
        found: list[Crossing] = []
        diagnostics = case.comparison.diagnostics
        for s in diagnostics.signatures or ():
            where = "" if s.sample is None else f", sample row {s.sample}"
            found.append(
                Crossing(
                    name=s.id.value,
                    kind="signature",
                    step=case.step,
                    detail=f"{s.scope.value} scope{where}",
                )
            )
        for gate in case.gates:
            if not gate.passed:
                value = "non-finite" if gate.value is None else f"{gate.value:.4g}"
                found.append(
                    Crossing(
                        name=gate.key,
                        kind="gate",
                        step=case.step,
                        detail=f"failed: {value} against the bar {gate.gate.bar:g}",
                    )
                )
        mean = diagnostics.mean_abs_diff
        if case.outcome in (Outcome.PASS, Outcome.MISMATCH) and mean is not None:
            self.figures[case.step] = float(mean)
            for r in run_signatures(sorted(self.figures.items())):
                at = "" if r.step is None else f", from step {r.step}"
                found.append(
                    Crossing(
                        name=r.id.value, kind="signature", step=case.step, detail=f"run scope{at}"
                    )
                )
        new = []
        for c in found:
            if c.name not in self.crossed:
                self.crossed.add(c.name)
                new.append(c)
        return tuple(new)


def _experiment(
    fmt: str, directory: Path, contract: ResolvedContract, experiment_id: str
) -> dict[str, Any]:
    source = FollowedImportSource(
        format=fmt,  # type: ignore[arg-type]  # one of FOLLOWED_FORMATS
        directory=str(directory),
        fields=FORMATS[fmt].fields,
        max_input_bytes=MAX_INPUT_BYTES,
    )
    experiment = {
        "experiment_id": experiment_id,
        "scenario_id": f"import:{fmt}",
        "scenario": {"level": "imported", "format": fmt},
        "contract": canonical(contract),
        "strategy": "import",
        "strict_fallback": False,
        "identity": {},
        "imported": msgspec.to_builtins(source),
    }
    check_decodes(experiment, str(directory), "experiment.json")
    return experiment


def _check_existing(run_dir: Path, experiment: dict[str, Any]) -> None:
    """An existing run directory is followed into only when it is this follow's run."""
    path = run_dir / layout.EXPERIMENT
    try:
        document = decode(path.read_bytes(), ExperimentDocument)
    except (OSError, JSONDocumentError) as exc:
        raise UsageError(
            f"{run_dir}: a directory of that name exists and {path.name} does not read as a "
            f"run's ({exc}); give another --experiment-id or --artifacts"
        ) from None
    ours = decode(msgspec.json.encode(experiment), ExperimentDocument)
    if document != ours:
        raise UsageError(
            f"{run_dir}: a run of that name exists that is not a follow of this directory, "
            "format and contract (only such a run is added to); give another --experiment-id"
        )


def follow(
    fmt: str,
    directory: Path,
    *,
    artifacts: Path,
    contract: ResolvedContract,
    experiment_id: str | None = None,
    settle: float = 5.0,
    idle: float | None = None,
    poll: float = 0.25,
    exit_on: frozenset[str] = frozenset(),
    on_step: Callable[[FollowedStep], None] = lambda step: None,
    on_start: Callable[[Path], None] = lambda run_dir: None,
) -> FollowResult:
    """Follow ``directory`` until a signal, ``idle`` seconds without a new complete step, or
    a crossing ``exit_on`` names; ``on_start`` is called with the run directory once it
    exists and the signal handlers are in place, ``on_step`` once per complete step."""
    if not directory.is_dir():
        raise UsageError(f"--follow {directory}: not a directory")
    _seconds("--settle", settle, zero=True)
    _seconds("--poll", poll, zero=False)
    if idle is not None:
        _seconds("--idle", idle, zero=False)
    name = experiment_id or default_follow_id(fmt, directory)
    check_experiment_id(name)
    experiment = _experiment(fmt, directory, contract, name)
    run_dir = artifacts / name
    if os.path.lexists(run_dir):
        _check_existing(run_dir, experiment)
    try:
        artifacts.mkdir(parents=True, exist_ok=True)
        remove_abandoned_staging(artifacts)
    except OSError as exc:
        raise StorageError(artifacts, "create a directory to import into", exc) from None
    store = ArtifactStore(artifacts, name)
    store.initialize(experiment, [])
    rows: list[dict[str, Any]] = []
    steps: list[FollowedStep] = []
    watch, crossings = _Watch(), _Crossings()
    ranks: list[int] = []
    scan = _NeutralScan()
    environment = environment_record()
    last_new = time.monotonic()
    with _Stop().installed() as stop:
        on_start(run_dir)
        while True:
            now = time.monotonic()
            if fmt == "nemo-rl":
                ready = _nemo_ready(directory, watch, settle, now)
            elif fmt == "jsonl":
                ready = _neutral_ready(directory, watch, scan, settle, now)
            else:
                ready = _slime_ready(directory, watch, settle, now, ranks)
            for complete in ready:
                if complete.step in watch.done or stop.signal is not None:
                    continue
                handled = _seal_step(fmt, complete, contract, artifacts, store, environment)
                watch.done.add(complete.step)
                rows.append(handled.rows[0])
                store.initialize(experiment, rows)
                followed = FollowedStep(
                    case=handled.cases[0],
                    sealed=handled.sealed,
                    crossings=crossings.add(handled.cases[0]),
                )
                steps.append(followed)
                on_step(followed)
                last_new = time.monotonic()
                if any(c.name in exit_on for c in followed.crossings):
                    return FollowResult(
                        run_dir=run_dir,
                        experiment_id=name,
                        steps=tuple(steps),
                        stopped_by="exit-on",
                    )
            if stop.signal is not None:
                return FollowResult(
                    run_dir=run_dir,
                    experiment_id=name,
                    steps=tuple(steps),
                    stopped_by=signal.Signals(stop.signal).name,
                )
            if idle is not None and time.monotonic() - last_new >= idle:
                return FollowResult(
                    run_dir=run_dir, experiment_id=name, steps=tuple(steps), stopped_by="idle"
                )
            time.sleep(poll)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Handled:
    cases: list[ImportedCase]
    rows: list[dict[str, Any]]
    sealed: bool


def _seal_step(
    fmt: str,
    complete: _Ready,
    contract: ResolvedContract,
    artifacts: Path,
    store: ArtifactStore,
    environment: dict[str, str | None],
) -> _Handled:
    """Judge and write one step under a staging directory, then rename its case directory
    into the run's ``cases/`` unless the run holds that case already."""
    staging = artifacts / f"{STAGING_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
    try:
        staging.mkdir()
    except OSError as exc:
        raise StorageError(artifacts, "create a staging directory", exc) from None
    try:
        run = RunWriter(FORMATS[fmt], contract, staging)
        run.environment = environment
        opened: list[InputFile] = []
        paths = complete.paths
        try:
            steps = (
                READERS[fmt](list(paths), opened)
                if complete.span is None
                else read_neutral_span(paths[0], complete.span, opened)
            )
            for step in steps:
                run.add(step, opened)
        finally:
            for file in opened:
                file.close()
        if len(run.cases) != 1:
            raise ImportInputError(
                paths[0], f"holds {len(run.cases)} steps where one step's files were expected"
            )
        case = run.cases[0]
        target = store.case_dir(case.case_id)
        if os.path.lexists(target):
            sealed = store.attempts(case.case_id)
            if sealed:
                case = dataclasses.replace(
                    case, attempt=f"{layout.CASES}/{case.case_id}/{sealed[0].name}"
                )
            return _Handled(cases=[case], rows=run.rows, sealed=False)
        other = _sealed_labels(store).get(case.label)
        if other is not None and other != case.case_id:
            raise ImportInputError(
                paths[0],
                f"step {case.step} is sealed in {store.directory} as case {other}, from other "
                "bytes; a sealed step is never rewritten (follow into another --experiment-id)",
            )
        try:
            os.rename(run.store.case_dir(case.case_id), target)
            fsync_dir(target.parent)
        except OSError as exc:
            raise StorageError(target, "publish the step into the run", exc) from None
        return _Handled(cases=run.cases, rows=run.rows, sealed=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _sealed_labels(store: ArtifactStore) -> dict[str, str]:
    """The run's plan rows: label to case id."""
    return {row.label: row.case_id for row in read_plan_log(store.directory).rows}
