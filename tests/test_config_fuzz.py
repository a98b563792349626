"""A config fuzzer: no config text ends in a traceback, and whatever plans can execute.

Two generators feed the real ``plan`` command (``cli.main``, in-process): raw JSON text (the
shipped configs with characters inserted, deleted and replaced; JSON-like token soup with
huge numbers, escapes, lone surrogates and deep nesting) and structured mutations of valid
configs (any node replaced by a hostile value: integers far beyond 64 bits, floats beyond
float range, strings with lone surrogates, control characters, terminal escapes, line and
paragraph separators and bidirectional overrides, nesting thousands deep, every wrong JSON
type; hostile keys added anywhere; keys duplicated). Every outcome must be one of:

- exit 2 with exactly one printable line on stderr, naming a JSON path (``$``...), and no
  traceback (an exception escaping ``main`` fails the test with its traceback);
- exit 0, after which the plan also passes execution's own validation (``execution_accepts``):
  the run directory and plan rows can be written, every case binds, the identity hashes, the
  prompts become token tensors inside the vocabulary the runtime has, and every generator seed
  the runtimes derive from ``sampling.seed`` is accepted by torch and numpy.

A few hundred examples run in the suite; ``LOGPROB_DRIFT_FUZZ_EXAMPLES=10000`` (or more) makes
it a benchmark-style search.
"""

from __future__ import annotations

import copy
import io
import json
import os
import random
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from drift_testing import S0, S0_HF, S3
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.cli import main
from pytest_logprob_drift.config import limits
from pytest_logprob_drift.errors import one_line
from pytest_logprob_drift.execute.protocol import bind_case
from pytest_logprob_drift.plan.binding import ExecutionPlan
from pytest_logprob_drift.policy import assemble
from pytest_logprob_drift.records import canonical_json
from pytest_logprob_drift.store.run import ArtifactStore
from pytest_logprob_drift.tables import render_table

EXAMPLES = int(os.environ.get("LOGPROB_DRIFT_FUZZ_EXAMPLES", "300"))
SETTINGS = settings(
    max_examples=max(EXAMPLES // 4, 1),  # four generators: EXAMPLES in all
    deadline=None,
    database=None,
    derandomize=EXAMPLES < 1000,  # the suite is reproducible; a long search explores
    suppress_health_check=list(HealthCheck),
)
BASES = {path.stem: json.loads(path.read_text(encoding="utf-8")) for path in (S0, S0_HF, S3)}
TEXTS = {path.stem: path.read_text(encoding="utf-8") for path in (S0, S0_HF, S3)}
CATALOGS = assemble()


# ----------------------------------------------------------------------------- the oracle


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="logprob-drift-fuzz-"))
    yield directory


def check_text(text: str, scratch: Path) -> None:
    """Plan ``text`` as a config file through the CLI and check the outcome."""
    config = scratch / "config.json"
    config.write_text(text, encoding="utf-8", errors="surrogatepass")
    out, err = io.StringIO(), io.StringIO()
    code = main(["plan", str(config)], out=out, err=err)
    if currently_in_test_context():
        event(f"plan exit {code}")
    for stream in (out.getvalue(), err.getvalue()):
        stream.encode("utf-8")  # printable on a UTF-8 terminal (no lone surrogates)
        assert "Traceback" not in stream
        assert all(line.isprintable() for line in stream.splitlines()), stream  # no escapes
    if code == 0:
        execution_accepts(plan_file(str(config), catalog=CATALOGS.operators), scratch)
        return
    assert code == 2, (code, err.getvalue())
    lines = err.getvalue().split("\n")
    assert len(lines) == 2 and lines[1] == "", err.getvalue()  # exactly one line
    line = lines[0]
    assert line.isprintable(), line  # no control characters or escape sequences
    assert line.startswith("logprob-drift: error: ") and "$" in line, line


def execution_accepts(execution_plan: ExecutionPlan, scratch: Path) -> None:
    """What execution itself would check before and while running a case, short of building
    engines: the store, bindings, identity hashing, token tensors and generator seeds."""
    import numpy
    import torch

    from pytest_logprob_drift.runtimes.smoke.runtime import SYNTHETIC_URI, CpuSmokeAdapter

    plan = execution_plan.plan
    identity = plan.identity
    rows = execution_plan.rows(CATALOGS.runtimes.runtimes)
    root = Path(tempfile.mkdtemp(dir=scratch))
    store = ArtifactStore(root, plan.experiment_id)
    store.initialize({"experiment_id": plan.experiment_id}, rows)
    json.dumps(rows, allow_nan=False).encode("utf-8")
    canonical_json(identity.canonical_identity()).encode("utf-8")
    for ec in execution_plan.cases:
        bind_case(ec, runtime_kind="cpu-smoke", identity=identity, device=plan.scenario.device)
    prompts = identity.prompts.token_ids
    for row in prompts:
        torch.tensor(row, dtype=torch.long)
    uri = identity.checkpoint.uri
    tokens = max(len(r) for r in prompts) + identity.sampling.max_new_tokens
    assert tokens <= limits.MAX_SEQUENCE_TOKENS
    if uri == SYNTHETIC_URI:
        CpuSmokeAdapter._check_identity(identity)  # the smoke runtime's own vocabulary check
    elif uri.startswith("tiny://"):
        from pytest_logprob_drift.runtimes.tiny_model import MAX_POSITIONS, VOCAB_SIZE

        assert max(max(row) for row in prompts) < VOCAB_SIZE
        assert max(len(r) for r in prompts) + identity.sampling.max_new_tokens <= MAX_POSITIONS
    elif Path(uri).is_dir() and (Path(uri) / "config.json").is_file():  # resolve_checkpoint
        model = json.loads((Path(uri) / "config.json").read_text())
        assert max(max(row) for row in prompts) < model["vocab_size"]
        longest = max(len(r) for r in prompts) + identity.sampling.max_new_tokens
        assert longest <= model["max_position_embeddings"]
    seed = identity.sampling.seed
    numpy.random.seed(seed)  # vLLM's engine seed
    for index in range(len(prompts)):
        torch.Generator().manual_seed(seed * 1_000_003 + index)  # the smoke runtime
        torch.Generator().manual_seed(seed + index)  # vLLM's request_seed


def test_the_oracle_accepts_the_shipped_configs(scratch: Path) -> None:
    for text in TEXTS.values():
        check_text(text, scratch)


# ----------------------------------------------------------------------------- raw text


class Raw:
    """A JSON fragment written verbatim (what ``json.dumps`` cannot produce)."""

    def __init__(self, text: str) -> None:
        self.text = text


HUGE_NUMBERS = st.sampled_from(
    [
        "9" * 5000,
        "-" + "1" * 4301,
        "1" + "0" * 25,
        str(2**64),
        str(2**63),
        str(2**32),
        "1e999",
        "-1e999",
        "1" * 400 + ".5",
        "0." + "0" * 500 + "1",
        "1E+00000000000000000000000400",
        "-0",
        "18446744073709551615",
    ]
)
ESCAPES = st.sampled_from(
    [
        "\\ud800",
        "\\udfff",
        "\\ud800\\ud800",
        "\\udbff\\udfff",
        "\\u0000",
        "\\u001b[31m",
        "\\n",
        "\\r",
        "\\u2028",
        "\\u2029",
        "\\u202e",
        "\\u0085",
        "\\x",
        "\\",
        "\\uZZZZ",
    ]
)
TOKENS = st.one_of(
    st.sampled_from(["{", "}", "[", "]", ":", ",", '"', "true", "false", "null", "NaN"]),
    st.sampled_from(['"schema_version"', '"identity"', '"sampling"', '"seed"', '"token_ids"']),
    st.sampled_from(["-Infinity", "Infinity", " ", "\n", "\ufeff", "\x00", "\x1b"]),
    HUGE_NUMBERS,
    ESCAPES.map(lambda e: f'"{e}"'),
    st.integers(-(2**70), 2**70).map(str),
    st.text(max_size=5),
)


@SETTINGS
@given(soup=st.lists(TOKENS, max_size=40), depth=st.integers(0, 3000))
def test_json_token_soup(scratch: Path, soup: list[str], depth: int) -> None:
    check_text("[" * depth + "".join(soup) + "]" * depth, scratch)


@SETTINGS
@given(
    base=st.sampled_from(sorted(TEXTS)),
    edits=st.lists(
        st.tuples(
            st.floats(0, 1),
            st.integers(0, 8),
            st.one_of(st.text(max_size=6), ESCAPES, HUGE_NUMBERS, st.sampled_from('{}[]",:')),
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_edited_config_text(scratch: Path, base: str, edits: list[tuple[float, int, str]]) -> None:
    text = TEXTS[base]
    for where, delete, insert in edits:
        at = int(where * len(text))
        text = text[:at] + insert + text[at + delete :]
    check_text(text, scratch)


# ----------------------------------------------------------------------------- structure


HOSTILE_STRINGS = st.one_of(
    st.sampled_from(
        [
            "",
            " ",
            "\ud800",
            "a\udfffb",
            "line\nbreak",
            "\x1b[2J\x1b[31mred",
            "\u202eevil",
            "tab\there",
            "\u2028\u2029\x85",
            "\x00nul",
            "é" * 128,
            "a" * 300,
            "../../etc/passwd",
            "/abs/path",
            "tiny://nope",
            "synthetic://other",
            "tiny://qwen3-h64-v1",
            "synthetic://cpu-smoke/v1",
            "bfloat16",
            "fsdp",
            "native",
            "allow_everything",
        ]
    ),
    st.text(max_size=20),
)
HOSTILE_VALUES = st.one_of(
    HOSTILE_STRINGS,
    HUGE_NUMBERS.map(Raw),
    st.integers(-(2**66), 2**66),
    st.sampled_from([0, 1, -1, 63, 64, 1023, 1024, 2**32 - 1, 2**32, 2**63 - 1, 2**64 - 1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
    st.integers(1, 5000).map(lambda n: Raw("[" * n + "]" * n)),
    st.integers(1, 200).map(lambda n: Raw('{"a":' * n + "1" + "}" * n)),
    st.just(Raw("NaN")),
    st.lists(st.integers(-3, 2**40), max_size=4),
    st.lists(st.lists(st.integers(0, 2**65), min_size=1, max_size=3), max_size=3),
    st.dictionaries(HOSTILE_STRINGS, st.integers(), max_size=3),
)


def nodes(document: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every node (objects' members, arrays' items) below the root."""
    children = (
        document.items()
        if isinstance(document, dict)
        else enumerate(document)
        if isinstance(document, list)
        else ()
    )
    for key, child in children:
        yield (*path, key)
        yield from nodes(child, (*path, key))


def serialize(value: Any, duplicate: set[int]) -> str:
    """JSON text of ``value``: ``Raw`` verbatim, objects whose id is in ``duplicate`` with
    their first member written twice."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        members = [f"{json.dumps(k)}:{serialize(v, duplicate)}" for k, v in value.items()]
        if id(value) in duplicate and members:
            members.append(members[0])
        return "{" + ",".join(members) + "}"
    if isinstance(value, list):
        return "[" + ",".join(serialize(v, duplicate) for v in value) + "]"
    return json.dumps(value)


@SETTINGS
@given(
    base=st.sampled_from(sorted(BASES)),
    seed=st.integers(0, 2**32),
    values=st.lists(HOSTILE_VALUES, min_size=1, max_size=4),
    keys=st.lists(HOSTILE_STRINGS, max_size=2),
    duplicate=st.booleans(),
)
def test_structured_mutations(
    scratch: Path, base: str, seed: int, values: list[Any], keys: list[str], duplicate: bool
) -> None:
    document = copy.deepcopy(BASES[base])
    pick = random.Random(seed)
    for value in values:  # replace nodes with hostile values
        path = pick.choice(list(nodes(document)))
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = copy.deepcopy(value)
    objects = [document] + [
        node
        for path in nodes(document)
        if isinstance(node := _at(document, path), dict) and not isinstance(node, Raw)
    ]
    for key in keys:  # hostile keys anywhere
        pick.choice(objects)[key] = copy.deepcopy(pick.choice(values))
    duplicated = {id(pick.choice(objects))} if duplicate else set()
    check_text(serialize(document, duplicated), scratch)


ID_ALPHABET = st.sampled_from("abcXYZ019._-éß漢\u0663")
BOUNDARY = {
    ("experiment_id",): st.text(ID_ALPHABET, min_size=1, max_size=260),
    ("identity", "sampling", "seed"): st.one_of(
        st.integers(0, 2**64), st.integers(2**32 - 3, 2**32 + 3)
    ),
    ("identity", "sampling", "max_new_tokens"): st.integers(-1, 600),
    ("identity", "sampling", "temperature"): st.floats(-1, 1e6, allow_nan=False),
    ("identity", "prompts", "token_ids"): st.lists(
        st.lists(st.integers(0, 1100), min_size=1, max_size=40), min_size=1, max_size=5
    ),
    ("identity", "checkpoint", "uri"): st.sampled_from(
        ["synthetic://cpu-smoke/v1", "tiny://qwen3-h64-v1", "LOCAL", "/nonexistent/model"]
    ),
    ("baseline", "batch", "size"): st.integers(-1, 2**64),
}


@SETTINGS
@given(base=st.sampled_from(sorted(BASES)), changes=st.data())
def test_values_at_the_boundaries_plan_only_if_they_execute(
    scratch: Path, base: str, changes: st.DataObject
) -> None:
    """Values near every execution limit: what plans must pass execution's validation."""
    document = copy.deepcopy(BASES[base])
    local = scratch / "local-checkpoint"
    local.mkdir(exist_ok=True)
    (local / "config.json").write_text('{"vocab_size": 100, "max_position_embeddings": 48}')
    for path in changes.draw(st.lists(st.sampled_from(sorted(BOUNDARY)), min_size=1, max_size=4)):
        value = changes.draw(BOUNDARY[path])
        _at(document, path[:-1])[path[-1]] = str(local) if value == "LOCAL" else value
    check_text(serialize(document, set()), scratch)


def _at(document: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        document = document[key]
    return document


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda d: d["identity"]["sampling"].update(seed=Raw("9" * 5000)), "sampling.seed"),
        (lambda d: d["identity"]["sampling"].update(seed=2**64), "sampling.seed"),
        (lambda d: d["identity"]["sampling"].update(seed=2**32), "sampling.seed"),
        (lambda d: d["identity"]["tokenizer"].update(id="x\ud800"), "tokenizer.id"),
        (lambda d: d["baseline"]["rollout"].update({"a\nb\x1b[31m": 1}), "rollout["),
        (lambda d: d.update(experiment_id="a" * 300), "experiment_id"),
        (lambda d: d.update(experiment_id="é" * 128), "experiment_id"),
        (lambda d: d["identity"]["prompts"].update(token_ids=[[64]]), "token_ids[0][0]"),
        (lambda d: d["identity"]["checkpoint"].update(uri="tiny://nope"), "checkpoint.uri"),
        (lambda d: d.update(description=Raw("[" * 100 + "]" * 100)), "description["),
        (lambda d: d.update(description=Raw("[" * 100000 + "]" * 100000)), "$"),
    ],
)
def test_the_issue_14_inputs_are_one_line_with_their_path(
    scratch: Path, mutate: Any, path: str
) -> None:
    document = copy.deepcopy(BASES["cross_config_s0_cpu_smoke"])
    mutate(document)
    config = scratch / "issue14.json"
    config.write_text(serialize(document, set()), encoding="utf-8", errors="surrogatepass")
    out, err = io.StringIO(), io.StringIO()
    assert main(["plan", str(config)], out=out, err=err) == 2
    assert err.getvalue().count("\n") == 1 and path in err.getvalue(), err.getvalue()
    assert err.getvalue().rstrip("\n").isprintable()


@pytest.mark.parametrize(
    "scenario_id", ["a\x1b[31mb", "x\u202ey", "two\nlines", "s0\U00018d09x", "plain-ok"]
)
def test_config_text_that_plan_prints_is_escaped(scratch: Path, scenario_id: str) -> None:
    """A config that plans is printed with its free text escaped (found by the 10,000-example
    fuzz: an unassigned code point in ``scenario_id`` reached the terminal raw)."""
    document = copy.deepcopy(BASES["cross_config_s0_cpu_smoke"])
    document["scenario_id"] = scenario_id
    config = scratch / "printed.json"
    config.write_text(serialize(document, set()), encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    assert main(["plan", str(config)], out=out, err=err) == 0, err.getvalue()
    lines = out.getvalue().splitlines()
    assert all(line.isprintable() for line in lines), out.getvalue()
    assert f" scenario {one_line(scenario_id)} (" in lines[0]
    assert scenario_id.isprintable() == (one_line(scenario_id) == scenario_id)


def test_a_table_cell_is_one_printable_line() -> None:
    table = render_table(["label", "note"], [["a\x1b[2Jb", "first\nsecond"], ["ok", "x\u202ey"]])
    assert table.splitlines()[2:] == [
        "a\\x1b[2Jb  first\\nsecond",
        "ok         x\\u202ey",
    ]


def test_limits_mirror_the_runtimes() -> None:
    """The built-in checkpoints the runtimes declare (what planning knows) equal the runtimes'
    own constants."""
    from pytest_logprob_drift.runtimes.smoke.runtime import SYNTHETIC_URI, VOCAB
    from pytest_logprob_drift.runtimes.tiny_model import (
        MAX_POSITIONS,
        TINY_ARCHITECTURES,
        TINY_MOE_ARCHITECTURES,
        TINY_QWEN3_DEEP_NAME,
        TINY_QWEN3_NAME,
        TINY_SCHEME,
        VOCAB_SIZE,
    )

    checkpoints = CATALOGS.runtimes.checkpoints
    assert checkpoints[SYNTHETIC_URI].vocab_size == VOCAB
    assert checkpoints[SYNTHETIC_URI].seed_multiplier == 1_000_003  # runtime.py's generators
    for name in (TINY_QWEN3_NAME, TINY_QWEN3_DEEP_NAME):
        tiny = checkpoints[TINY_SCHEME + name]
        assert (tiny.vocab_size, tiny.max_positions) == (VOCAB_SIZE, MAX_POSITIONS)
    builds = (*TINY_ARCHITECTURES, *TINY_MOE_ARCHITECTURES)
    for arch in builds:  # the same vocabulary and context as the tiny Qwen3
        declared = checkpoints[TINY_SCHEME + arch.name]
        assert (declared.vocab_size, declared.max_positions) == (VOCAB_SIZE, MAX_POSITIONS)
    assert len(checkpoints) == 3 + len(builds)  # a new one needs its limits here


def test_seed_limits_match_the_runtimes_derivations() -> None:
    """The largest seed planning accepts is accepted by every runtime's derivation."""
    import numpy
    import torch

    from pytest_logprob_drift.runtimes.transformers.engine import sample_seed
    from pytest_logprob_drift.runtimes.vllm.engine import request_seed

    seed, samples = limits.MAX_SEED, 1 << 20
    numpy.random.seed(seed)
    torch.Generator().manual_seed(seed * 1_000_003 + samples)
    torch.Generator().manual_seed(request_seed(seed, samples))
    torch.Generator().manual_seed(sample_seed(seed, samples))
    with pytest.raises(ValueError):
        numpy.random.seed(limits.MAX_SEED + 1)
