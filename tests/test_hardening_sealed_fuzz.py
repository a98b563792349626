"""Property test: no re-sealed hostile file crashes ``verify``, ``report`` or ``run`` (issue 21,
class 4).

One real run is sealed once per module with the ``cpu-smoke`` runtime (the full-vocabulary
smoke experiment of ``tests/data/pre_issue20``, the baseline executed twice so the attribution
measures a noise floor). Each example copies it, rewrites one sealed file the way an attacker
with write access to an unkeyed run would (JSON: a wrong type at any path, a missing or extra
key, nesting hundreds to a hundred thousand deep, huge numbers, NaN/Infinity literals,
non-UTF-8 bytes; tensors: another dtype (complex included), another rank, another shape than
the token grid, a stride-0 tensor declaring gigabytes from a few bytes of storage, missing or
extra tensors, a pickle that is no mapping of tensors, a truncated file), and re-seals it with
plain SHA-256 digests as the seal format documents it (the attempt's ``COMPLETE``, the
attribution's ``COMPLETE`` that names each attempt's ``COMPLETE`` digest, the run seal of
``experiment.json`` and ``plan.jsonl``). Then ``verify``, ``report`` (text; ``--json`` with
``--html``) and ``run`` (a resume) each run in their own process and must end with their
documented exit code and a verdict (a table, a JSON document) or one line on stderr: never a
Python traceback, never exit 3 from a reader, and a resume judges a hostile attempt invalid
and executes its case again instead of failing it.

Stated bounds, per command on one hostile input: 30 s of CPU time (a timer kills the process; its
CPU time is also checked) and 1 GiB of memory (``RLIMIT_AS`` at the address space of the process
that imported torch plus 1 GiB; the peak resident growth is also checked). Each command is a child
forked from the session's ``tests/cli_fork_server.py`` (the ``cli_process`` fixture), which imported
torch once (see there).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_processes import Bounded, Finished, ForkServer, bounded
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.drift_testing import ROOT
from tests.resealing import reseal

pytestmark = [pytest.mark.slow, pytest.mark.process]

DATA = ROOT / "tests" / "data" / "pre_issue20"
CONFIG = DATA / "smoke.json"
EXPERIMENT = "fixture-pre20-cpu-smoke"
EXPECT = "logp.backend=smoke_only.logp_offset=MISMATCH"
CPU_SECONDS = 30
MEMORY_BYTES = 1 << 30
EXAMPLES = 25
VERIFY_VERDICT = re.compile(r"^\d+ attempt\(s\), \d+ attribution\(s\), \d+ invalid$", re.M)
ONE_ERROR_LINE = re.compile(r"^logprob-drift: error: [^\n]+\n$")
PLACEHOLDER = "\u2603hostile\u2603"


# --------------------------------------------------------------------------- the processes


@pytest.fixture(scope="module")
def server(cli_process: ForkServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bounded]:
    scratch = tmp_path_factory.mktemp("fork-server")
    with bounded(cli_process, scratch, seconds=CPU_SECONDS, memory_bytes=MEMORY_BYTES) as serving:
        yield serving


def _run_command(artifacts: Path) -> tuple[str | Path, ...]:
    return (
        "run",
        CONFIG,
        "--runtime",
        "cpu-smoke",
        "--allow-smoke-operators",
        "--artifacts",
        artifacts,
        "--expect",
        EXPECT,
        "--baseline-repeats",
        "2",
        "--json",
    )


@pytest.fixture(scope="module")
def pristine(server: Bounded, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sealed run every example copies (built by the server, so a resume in a child sees
    the same environment and reuses every attempt an example left intact)."""
    artifacts = tmp_path_factory.mktemp("pristine") / "runs"
    finished = server(*_run_command(artifacts))
    assert finished.code == 0, finished.describe()
    run_dir = artifacts / EXPERIMENT
    assert len(list((run_dir / "attributions").iterdir())) == 1
    assert len(list((run_dir / "cases").glob("*/*/COMPLETE"))) == 4
    page = tmp_path_factory.mktemp("warm") / "page.html"
    assert server.warm("report", run_dir, "--html", page) == 0
    page.unlink()
    return run_dir


# --------------------------------------------------------------------------- mutations

JSON_TARGETS = (
    "comparison.json",
    "identity.json",
    "actual.json",
    "requested.json",
    "materialized.json",
    "COMPLETE",
)
TENSOR_TARGETS = ("score_rollout.pt", "score_training.pt", "token_diffs.pt", "divergence.pt")
RUN_TARGETS = ("attribution.json", "attribution COMPLETE", "experiment.json", "plan.jsonl")

wrong_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
raw_literals = st.sampled_from(
    ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "9" * 5000, "1" * 400, "1e-400"]
)


def _paths(document: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(document, dict):
        for key, value in document.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            yield from _paths(value, (*prefix, index))


def _set(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = document
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    return document


def _nested(depth: int) -> Any:
    value: Any = 0
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


def json_mutation(draw: st.DrawFn, document: Any) -> tuple[str, bytes]:
    """A description and the new bytes of a JSON file."""
    paths = list(_paths(document))
    path = draw(st.sampled_from(paths))
    kind = draw(st.sampled_from(["type", "delete", "extra", "nest", "raw", "non-utf8", "raw-nest"]))
    doc = json.loads(json.dumps(document))
    if kind == "type":
        doc = _set(doc, path, draw(wrong_values))
    elif kind == "delete" and path:
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        del parent[path[-1]]
    elif kind == "extra":
        target = doc
        for step in path:
            target = target[step]
        if isinstance(target, dict):
            target[draw(st.text(min_size=1, max_size=6))] = draw(wrong_values)
        elif isinstance(target, list):
            target.append(draw(wrong_values))
        else:
            doc = _set(doc, path, [target, draw(wrong_values)])
    elif kind == "nest":
        doc = _set(doc, path, _nested(draw(st.sampled_from([100, 500, 990]))))
    data = json.dumps(doc, indent=1, sort_keys=True).encode()
    if kind in ("raw", "non-utf8", "raw-nest"):
        data = json.dumps(_set(doc, path, PLACEHOLDER), sort_keys=True).encode()
        quoted = json.dumps(PLACEHOLDER).encode()
        if kind == "raw":
            replacement = draw(raw_literals).encode()
        elif kind == "non-utf8":
            replacement = b'"\xff\xfe\xc3(' + draw(st.binary(max_size=4)) + b'"'
        else:  # deeper than any parser should descend (a stack of arrays)
            depth = draw(st.sampled_from([5_000, 100_000]))
            replacement = b"[" * depth + b"]" * depth
        data = data.replace(quoted, replacement)
    return f"{kind} at {list(path)!r}", data


def _tensor_file(tensors: Any) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    return buffer.getvalue()


def tensor_mutation(
    draw: st.DrawFn, tensors: dict[str, torch.Tensor], raw: bytes
) -> tuple[str, bytes]:
    name = draw(st.sampled_from(sorted(tensors)))
    kind = draw(
        st.sampled_from(
            [
                "dtype",
                "rank-1",
                "rank-3",
                "shape",
                "stride0",
                "missing",
                "extra",
                "scalar",
                "empty",
                "not-tensors",
                "truncated",
                "nan",
            ]
        )
    )
    changed = dict(tensors)
    tensor = tensors[name]
    if kind == "dtype":
        dtype = draw(
            st.sampled_from(
                [
                    torch.complex64,
                    torch.complex128,
                    torch.float16,
                    torch.int32,
                    torch.uint8,
                    torch.bool,
                ]
            )
        )
        changed[name] = tensor.to(dtype)
    elif kind == "rank-1":
        changed[name] = tensor.reshape(-1)
    elif kind == "rank-3":
        changed[name] = tensor.unsqueeze(0).repeat(2, *([1] * tensor.dim()))
    elif kind == "shape":
        flat = tensor.reshape(-1)
        changed[name] = (
            torch.cat([flat, flat[:1]]) if tensor.dim() < 2 else tensor[:, :-1].contiguous()
        )
    elif kind == "stride0":  # a few bytes of storage declaring 8e10 bytes of float64
        changed[name] = torch.zeros(1, dtype=torch.float64).expand(100_000, 100_000)
    elif kind == "missing":
        del changed[name]
    elif kind == "extra":
        changed["extra_" + draw(st.text(alphabet="abc", min_size=1, max_size=3))] = tensor
    elif kind == "scalar":
        changed[name] = torch.tensor(1.5)
    elif kind == "empty":
        changed[name] = tensor.new_empty((0,) * max(tensor.dim(), 1))
    elif kind == "nan" and tensor.is_floating_point():
        changed[name] = torch.full_like(tensor, float("nan"))
    if kind == "not-tensors":
        payload = draw(st.sampled_from([[1, 2, 3], {"a": [1, 2]}, {1: torch.zeros(2)}, "text"]))
        return f"not-tensors {payload!r}", _tensor_file(payload)
    if kind == "truncated":
        cut = draw(st.integers(min_value=0, max_value=len(raw) - 1))
        return f"truncated at {cut}", raw[:cut]
    return f"{kind} of {name}", _tensor_file(changed)


# --------------------------------------------------------------------------- the property


def _target(run_dir: Path, draw: st.DrawFn) -> Path:
    attempts = sorted((run_dir / "cases").glob("*/*/COMPLETE"))
    kind = draw(st.sampled_from(["json", "tensor", "run"]))
    if kind == "run":
        name = draw(st.sampled_from(RUN_TARGETS))
        attribution = next((run_dir / "attributions").iterdir())
        return {
            "attribution.json": attribution / "attribution.json",
            "attribution COMPLETE": attribution / "COMPLETE",
            "experiment.json": run_dir / "experiment.json",
            "plan.jsonl": run_dir / "plan.jsonl",
        }[name]
    attempt = draw(st.sampled_from(attempts)).parent
    return attempt / draw(st.sampled_from(JSON_TARGETS if kind == "json" else TENSOR_TARGETS))


def _mutate(path: Path, draw: st.DrawFn) -> str:
    raw = path.read_bytes()
    if path.suffix == ".pt":
        tensors = torch.load(path, weights_only=True)
        what, data = tensor_mutation(draw, tensors, raw)
    elif path.name == "plan.jsonl":
        lines = raw.decode().splitlines()
        row = draw(st.integers(min_value=0, max_value=len(lines) - 1))
        what, line = json_mutation(draw, json.loads(lines[row]))
        lines_bytes = [line.encode() for line in lines]
        lines_bytes[row] = line.replace(b"\n", b"")
        data = b"\n".join(lines_bytes) + b"\n"
        what = f"row {row}: {what}"
    else:
        what, data = json_mutation(draw, json.loads(raw))
    path.write_bytes(data)
    return what


def _check(note: str, finished: Finished, verdict: Callable[[Finished], None]) -> None:
    """Within the bounds, no traceback, and either exit 2 with one line on stderr or what
    ``verdict`` expects of the command."""
    try:
        assert finished.signal is None  # not killed by a timer or for memory
        assert "Traceback" not in finished.stdout + finished.stderr
        assert finished.cpu_s < CPU_SECONDS
        assert finished.rss_growth_bytes < MEMORY_BYTES
        if finished.code == 2:
            assert ONE_ERROR_LINE.fullmatch(finished.stderr)
        else:
            verdict(finished)
    except AssertionError as exc:
        raise AssertionError(f"{note}\n{finished.describe()}") from exc


def _verify_verdict(finished: Finished) -> None:
    assert finished.code in (0, 1)
    assert finished.stderr == ""
    assert VERIFY_VERDICT.search(finished.stdout)


def _report_text_verdict(finished: Finished) -> None:
    assert finished.code == 0
    assert finished.stderr == ""
    lines = finished.stdout.splitlines()
    assert re.match(r"\d+ case\(s\): ", lines[0]), lines[0]  # the findings come first
    assert any(line.startswith("case_id") for line in lines)  # then the case table


def _report_json_verdict(finished: Finished) -> None:
    assert finished.code == 0
    assert finished.stderr == ""
    assert "cases" in json.loads(finished.stdout)


def exercise(draw: st.DrawFn, server: Bounded, pristine: Path) -> None:
    """One hostile example: copy the sealed run, rewrite and re-seal one file, then verify,
    report (text; JSON with HTML) and resume it (AssertionError naming the file and change)."""
    example = server.scratch / f"example-{server.count}"
    artifacts = example / "runs"
    shutil.copytree(pristine.parent, artifacts)
    run_dir = artifacts / EXPERIMENT
    target = _target(run_dir, draw)
    note = f"{target.relative_to(run_dir)}: {_mutate(target, draw)}"
    reseal(run_dir, target)

    verified = server("verify", run_dir)
    _check(note, verified, _verify_verdict)
    if draw(st.booleans()):  # each report renders the whole page (seconds): one mode a time
        reported = server("report", run_dir, "--html", example / "page.html")
        _check(note, reported, _report_text_verdict)
    else:
        reported = server("report", run_dir, "--json", "--html", example / "page.html")
        _check(note, reported, _report_json_verdict)
    attempt_invalid = target.parent.parent.parent.name == "cases" and any(
        line.split()[1:3] == [target.parent.name, "invalid"]
        for line in verified.stdout.splitlines()
    )

    # a re-sealed plan.jsonl line that is no plan row makes the run invalid for every reader
    plan_invalid = target.name == "plan.jsonl" and verified.code == 1

    def resumed_verdict(finished: Finished) -> None:
        if plan_invalid:
            assert finished.code == 1
            assert ONE_ERROR_LINE.fullmatch(finished.stderr)
            assert "plan.jsonl: sealed line" in finished.stderr
            assert "is not a plan row" in finished.stderr
            return
        assert finished.code == 0
        document = json.loads(finished.stdout)
        assert document["failures"] == []
        if attempt_invalid:  # the hostile attempt was judged invalid, its case executed again
            assert all(r["attempt_dir"] != str(target.parent) for r in document["results"])

    _check(note, server(*_run_command(artifacts)), resumed_verdict)
    shutil.rmtree(example)


@given(data=st.data())
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate),  # a shrink would cost hundreds of processes
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_resealed_hostile_file_gives_a_verdict_or_one_line(
    data: st.DataObject, server: Bounded, pristine: Path
) -> None:
    exercise(data.draw, server, pristine)
