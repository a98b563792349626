"""What planning knows about a checkpoint comes from what it is handed: the built-in
checkpoints the registered runtimes declare (issue 20), or a local checkpoint directory's
config.json, which is read as a regular file of bounded size and refused at planning, in one
line naming the file and the field, when execution could not use it (issue 21, class 9).
"""

from __future__ import annotations

import copy
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from drift_testing import S0_HF

import pytest_logprob_drift
from pytest_logprob_drift import parse_config
from pytest_logprob_drift.cli import main
from pytest_logprob_drift.config.limits import CONFIG_JSON_LIMIT
from pytest_logprob_drift.errors import ConfigError
from pytest_logprob_drift.execute.runtime_catalog import RuntimeCatalog
from pytest_logprob_drift.records import BuiltinCheckpoint, RuntimeInfo, ScenarioLevel

pytest_plugins = ["pytester"]

DOCUMENT = json.loads(S0_HF.read_text(encoding="utf-8"))
"""S0_HF: prompt token ids up to 960, 16 new tokens after the longest (6-token) prompt."""


def config_for(tmp_path: Path, uri: str) -> Path:
    document = copy.deepcopy(DOCUMENT)
    document["identity"]["checkpoint"]["uri"] = uri
    config = tmp_path / "experiment.json"
    config.write_text(json.dumps(document), encoding="utf-8")
    return config


def plan(config: Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["plan", str(config)], out=out, err=err)
    return code, err.getvalue()


def checkpoint_with(tmp_path: Path, text: bytes) -> Path:
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    (directory / "config.json").write_bytes(text)
    return directory


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (b'{"vocab_size": 1024,', "config.json: not JSON (line 1 column 21: Expecting"),
        (b"[1024]", "config.json: not a JSON object"),
        (b'{"vocab_size": ' + b"9" * 5000 + b"}", "config.json: not JSON (ValueError)"),
        (b'{"vocab_size": 1000000000000}', "config.json: vocab_size is 1000000000000; a vocab"),
        (b'{"vocab_size": 0}', "config.json: vocab_size is 0; a vocabulary size is an integer"),
        (b'{"vocab_size": "1024"}', 'config.json: vocab_size is "1024"; a vocabulary size'),
        (b'{"vocab_size": true}', "config.json: vocab_size is true; a vocabulary size"),
        (
            b'{"max_position_embeddings": -512}',
            "config.json: max_position_embeddings is -512; a context length is an integer 1 .. ",
        ),
        (b'{"max_position_embeddings": 512.0}', "max_position_embeddings is 512.0; a context"),
        (b'{"text_config": {"vocab_size": -1}}', "config.json: text_config.vocab_size is -1"),
        (b'{"vocab_size": [1]}', "config.json: vocab_size is list; a vocabulary size"),
    ],
)
def test_a_local_config_json_execution_cannot_use_is_refused_at_planning(
    tmp_path: Path, text: bytes, needle: str
) -> None:
    directory = checkpoint_with(tmp_path, text)
    code, err = plan(config_for(tmp_path, str(directory)))
    assert code == 2, err
    assert err.count("\n") == 1 and err.rstrip("\n").isprintable(), err
    assert f"$.identity.checkpoint.uri: {directory / 'config.json'}: " in err, err
    assert needle in err, err


def test_the_plugin_refuses_it_at_collection_in_one_line(pytester: pytest.Pytester) -> None:
    directory = checkpoint_with(pytester.path, b'{"max_position_embeddings": -1}')
    config = config_for(pytester.path, str(directory))
    result = pytester.runpytest("--drift-config", config.name, "--drift-plan-only")
    assert result.ret == 2
    result.stdout.fnmatch_lines(
        [f"*: $.identity.checkpoint.uri: {directory}/config.json: max_position_embeddings is -1;*"]
    )
    assert "Traceback" not in result.stdout.str()


def test_the_largest_sizes_execution_accepts_are_accepted(tmp_path: Path) -> None:
    text = b'{"vocab_size": 2147483648, "max_position_embeddings": 9223372036854775807}'
    code, err = plan(config_for(tmp_path, str(checkpoint_with(tmp_path, text))))
    assert code == 0, err


def test_a_symlinked_config_json_is_read_and_its_limits_apply(tmp_path: Path) -> None:
    """Hugging Face's cache links every snapshot file into a blob: a link to a regular file is
    a regular file."""
    blob = tmp_path / "blob"
    blob.write_text('{"vocab_size": 960, "text_config": {"max_position_embeddings": 4096}}')
    directory = tmp_path / "snapshot"
    directory.mkdir()
    (directory / "config.json").symlink_to(blob)
    code, err = plan(config_for(tmp_path, str(directory)))
    assert code == 2
    assert "token_ids[2][5]: token id 960 is outside the vocabulary of" in err, err
    assert "(960 ids: 0 .. 959)" in err, err


def test_a_checkpoint_not_there_yet_is_left_to_execution(tmp_path: Path) -> None:
    code, err = plan(config_for(tmp_path, str(tmp_path / "not-downloaded-yet")))
    assert code == 0, err
    (tmp_path / "empty").mkdir()
    code, err = plan(config_for(tmp_path, str(tmp_path / "empty")))
    assert code == 0, err


def plan_in_subprocess(config: Path) -> subprocess.CompletedProcess[str]:
    """``plan`` in its own interpreter, so that a read that blocks fails the test by timing
    out instead of hanging the suite."""
    path = [str(Path(pytest_logprob_drift.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    return subprocess.run(
        [sys.executable, "-m", "pytest_logprob_drift", "plan", str(config)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},  # this package, not another
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_a_config_json_that_is_not_a_regular_file_is_refused_without_reading(
    tmp_path: Path, kind: str
) -> None:
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    target = directory / "config.json"
    if kind == "fifo":
        os.mkfifo(target)  # opening it to read would wait for a writer
    elif kind == "device":
        target.symlink_to("/dev/zero")  # reading it would never end
    else:
        target.mkdir()
    result = plan_in_subprocess(config_for(tmp_path, str(directory)))
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"{target}: not a regular file" in result.stderr


def test_a_config_json_over_the_cap_is_refused_before_reading(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    with open(directory / "config.json", "wb") as sparse:
        sparse.truncate(CONFIG_JSON_LIMIT + 1)  # no data blocks: reading it would cost 16 MiB
    code, err = plan(config_for(tmp_path, str(directory)))
    assert code == 2
    assert (
        f"config.json: {CONFIG_JSON_LIMIT + 1} bytes; planning reads a config.json of at most "
        f"{CONFIG_JSON_LIMIT}" in err
    ), err


# ----------------------------------------------------------- the runtimes' declarations


def runtime(name: str, *checkpoints: BuiltinCheckpoint) -> RuntimeInfo:
    return RuntimeInfo(
        name=name,
        executes_on=(("cpu", (ScenarioLevel.S0,)),),
        adapter="nowhere:Adapter",
        extra=None,
        summary="a test runtime",
        checkpoints=checkpoints,
    )


FAKE = BuiltinCheckpoint(uri="fake://model-v1", vocab_size=961, max_positions=22)


def parsed(uri: str, checkpoints: Any, max_new_tokens: int = 16) -> ConfigError | None:
    document = copy.deepcopy(DOCUMENT)
    document["identity"]["checkpoint"]["uri"] = uri
    document["identity"]["sampling"]["max_new_tokens"] = max_new_tokens
    try:
        parse_config(document, checkpoints=checkpoints)
    except ConfigError as error:
        return error
    return None


def test_planning_checks_the_checkpoints_it_is_handed() -> None:
    """A checkpoint a runtime declares is known with its limits, its scheme's other URIs are
    unknown, and the production runtimes' declarations are not consulted."""
    checkpoints = RuntimeCatalog((runtime("one", FAKE), runtime("two", FAKE))).checkpoints
    assert dict(checkpoints) == {"fake://model-v1": FAKE}  # served by two runtimes, one entry
    assert parsed("fake://model-v1", checkpoints) is None  # 6 + 16 = 22 positions
    error = parsed("fake://model-v1", checkpoints, max_new_tokens=17)
    assert error is not None and "exceed the 22 positions of fake://model-v1" in error.message
    error = parsed("fake://model-v2", checkpoints)
    assert error is not None and error.path == "$.identity.checkpoint.uri"
    assert error.message == "unknown checkpoint 'fake://model-v2' (known: fake://model-v1)"
    assert parsed("tiny://qwen3-h64-v1", checkpoints) is None  # not declared: not its scheme
    error = parsed("tiny://nope", RuntimeCatalog((runtime("three"),)).checkpoints)
    assert error is None  # nothing declares tiny:// here: a path the runtime will not find


def test_two_runtimes_may_not_declare_one_checkpoint_differently() -> None:
    other = BuiltinCheckpoint(uri="fake://model-v1", vocab_size=961, max_positions=4096)
    with pytest.raises(ConfigError) as info:
        RuntimeCatalog((runtime("one", FAKE), runtime("two", other)))
    assert "runtime two: checkpoint 'fake://model-v1'" in info.value.render()
    assert "another runtime declares it with other limits" in info.value.render()
    with pytest.raises(ConfigError, match="has a scheme"):
        RuntimeCatalog((runtime("one", BuiltinCheckpoint(uri="/models/x", vocab_size=8)),))


def test_the_production_runtimes_share_the_tiny_checkpoint() -> None:
    from pytest_logprob_drift.runtimes import HF, PRODUCTION_RUNTIMES, VLLM_HF

    assert HF.checkpoints == VLLM_HF.checkpoints
    assert sorted(RuntimeCatalog(PRODUCTION_RUNTIMES).checkpoints) == [
        "tiny://llama-h64-v1",
        "tiny://mistral-h64-v1",
        "tiny://olmoe-h128-v1",
        "tiny://qwen2-h64-v1",
        "tiny://qwen3-deep-l8-h64-v1",
        "tiny://qwen3-h64-v1",
        "tiny://qwen3-moe-h128-v1",
    ]


def test_a_declared_seed_rule_bounds_the_seed() -> None:
    """A runtime that seeds sample ``index`` with ``seed * m + index`` gets seeds refused whose
    derived seeds leave torch's generator range (the shipped rules never do: MAX_SEED bounds
    them)."""
    wide = BuiltinCheckpoint(uri="fake://wide-v1", vocab_size=1024, seed_multiplier=2**33)
    checkpoints = RuntimeCatalog((runtime("wide", wide),)).checkpoints
    document = copy.deepcopy(DOCUMENT)
    document["identity"]["checkpoint"]["uri"] = "fake://wide-v1"
    document["identity"]["sampling"]["seed"] = 2**31 - 1  # (2**31 - 1) * 2**33 + 3 < 2**64
    parse_config(document, checkpoints=checkpoints)
    document["identity"]["sampling"]["seed"] = 2**31
    with pytest.raises(ConfigError) as info:
        parse_config(document, checkpoints=checkpoints)
    assert info.value.path == "$.identity.sampling.seed"
    assert info.value.message == (
        "2147483648 is out of range: seed * 8589934592 + index (how fake://wide-v1 is "
        "sampled) exceeds torch's generator range"
    )
