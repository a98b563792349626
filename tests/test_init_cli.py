"""``logprob-drift init``: a starter experiment for a checkpoint directory and a prompt file
that plans, built from what the chosen runtime's record declares; never overwrites a file;
each bad input is one line naming the file (and line), exit 2.

Runs the real CLI in process on tiny checkpoints built from code (nothing executes here; the
run of an ``init`` output is in tests/runtimes/test_architectures.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from drift_testing import cli

from pytest_logprob_drift.policy import runtime_catalog
from pytest_logprob_drift.runtimes.tiny_model import (
    TINY_ARCHITECTURES,
    build_tiny_architecture,
)

LLAMA = next(a for a in TINY_ARCHITECTURES if a.name.startswith("llama"))


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny Llama checkpoint and a prompt file ``prompts`` wrote for it (3 prompts)."""
    root = tmp_path_factory.mktemp("init")
    model_dir = root / LLAMA.name
    build_tiny_architecture(LLAMA, model_dir)
    source = root / "p.txt"
    source.write_text("The rollout engine samples.\nDoes it drift?\nNumbers 1 2 3.\n")
    prompts = root / "prompts.json"
    code, _, err = cli(
        "prompts", "--checkpoint", model_dir, source, "--chat-template", "--output", prompts
    )
    assert code == 0, err
    return model_dir, prompts


def _init(
    model_dir: Path, prompts: Path, output: Path, runtime: str, *extra: str
) -> tuple[int, str, str]:
    return cli(
        "init",
        "--checkpoint",
        model_dir,
        "--prompts",
        prompts,
        "--runtime",
        runtime,
        "--output",
        output,
        *extra,
    )


def _one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("logprob-drift: error: "), err
    for needle in needles:
        assert needle in err, (needle, err)


def _trials(runtime: str, baseline_dtype: str) -> list[dict[str, Any]]:
    """What the runtime record declares, less the values equal to the starter baseline's."""
    info = runtime_catalog().get(runtime)
    baseline = {
        "rollout.dtype": baseline_dtype,
        "training.compute_dtype": baseline_dtype,
        **dict(info.baseline),
    }
    expected = []
    for trial in info.interventions:
        values = [v for v in trial.values if v != baseline.get(trial.path)]
        if values:
            expected.append(
                {"path": trial.path, "values": values, "description": trial.description}
            )
    return expected


@pytest.mark.parametrize("runtime", ["hf", "vllm-hf"])
def test_init_writes_a_starter_that_plans(
    llama: tuple[Path, Path], tmp_path: Path, runtime: str
) -> None:
    model_dir, prompts = llama
    output = tmp_path / "experiment.json"
    code, out, err = _init(model_dir, prompts, output, runtime)
    assert code == 0, err
    # the run command expects what the starter is for: a float32 baseline, bf16 on one side
    # in each precision trial (over the contract by design), every other case within it
    expect = (
        " --expect rollout.dtype=bfloat16=MISMATCH"
        " --expect training.compute_dtype=bfloat16=MISMATCH"
    )
    assert f"next: logprob-drift run {output} --runtime {runtime}{expect}\n" in out
    document = json.loads(output.read_text())
    assert document["baseline"]["rollout"]["dtype"] == "float32"  # the checkpoint's config.json
    assert document["baseline"]["training"]["compute_dtype"] == "float32"
    assert document["baseline"]["rollout"]["enable_prefix_caching"] is False
    assert document["baseline"]["rollout"]["enforce_eager"] is True
    assert document["baseline"]["batch"]["size"] == 3  # three prompts
    assert document["interventions"] == _trials(runtime, "float32")
    assert all(i["description"] for i in document["interventions"])
    identity = document["identity"]
    assert identity["checkpoint"]["uri"] == str(model_dir)
    assert identity["prompts"]["file"] == str(prompts)  # not below the output's directory
    template = json.loads(prompts.read_text())["source"]["chat_template_sha256"]
    assert identity["tokenizer"]["chat_template"] == f"sha256:{template}"
    code, planned, err = cli("plan", output, "--json")
    assert code == 0, err
    assert len(json.loads(planned)["cases"]) == 1 + sum(
        len(i["values"]) for i in json.loads(output.read_text())["interventions"]
    )
    labels = [c["label"] for c in json.loads(planned)["cases"]]
    expected = ["baseline"] + [
        f"{i['path']}={str(v).lower()}" for i in document["interventions"] for v in i["values"]
    ]
    assert labels == expected
    if runtime == "vllm-hf":
        paths = {i["path"] for i in document["interventions"]}
        assert {
            "rollout.tensor_parallel_size",
            "rollout.enable_prefix_caching",
            "rollout.enforce_eager",
        } <= paths


def test_a_bf16_checkpoint_gets_a_bf16_baseline(llama: tuple[Path, Path], tmp_path: Path) -> None:
    model_dir = tmp_path / "bf16"
    shutil.copytree(llama[0], model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config["dtype"] = "bfloat16"
    (model_dir / "config.json").write_text(json.dumps(config))
    prompts = tmp_path / "prompts.json"
    shutil.copy(llama[1], prompts)
    output = tmp_path / "experiment.json"
    code, out, err = _init(model_dir, prompts, output, "hf")
    assert code == 0, err
    # a 16-bit baseline drifts over the contract in every case: the attribution tells them apart
    assert f"next: logprob-drift run {output} --runtime hf --expect '*=MISMATCH'\n" in out
    document = json.loads(output.read_text())
    assert document["baseline"]["rollout"]["dtype"] == "bfloat16"
    assert document["identity"]["prompts"]["file"] == "prompts.json"  # beside the output
    dtype_trials = {
        i["path"]: i["values"] for i in document["interventions"] if i["path"].endswith("dtype")
    }
    assert dtype_trials == {"rollout.dtype": ["float32"], "training.compute_dtype": ["float32"]}
    assert document["interventions"] == _trials("hf", "bfloat16")


def test_init_never_overwrites(llama: tuple[Path, Path], tmp_path: Path) -> None:
    output = tmp_path / "experiment.json"
    output.write_text("mine\n")
    code, _, err = _init(*llama, output, "hf")
    _one_line_error(code, err, str(output), "already exists")
    assert output.read_text() == "mine\n"
    link = tmp_path / "dangling.json"
    link.symlink_to(tmp_path / "nowhere.json")
    code, _, err = _init(*llama, link, "hf")
    _one_line_error(code, err, str(link), "already exists")
    assert not (tmp_path / "nowhere.json").exists()


def test_each_bad_input_is_one_line(llama: tuple[Path, Path], tmp_path: Path) -> None:
    model_dir, prompts = llama
    not_json = tmp_path / "bad.json"
    not_json.write_text('{"token_ids": [[1, 2],\n  [3,\n}\n')
    out_of_vocab = tmp_path / "vocab.json"
    out_of_vocab.write_text(json.dumps({"token_ids": [[1, 2], [3, 5000]]}))
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    no_config = tmp_path / "no-config"
    no_config.mkdir()
    bad_dtype = tmp_path / "bad-dtype"
    shutil.copytree(model_dir, bad_dtype)
    config = json.loads((bad_dtype / "config.json").read_text())
    config["dtype"] = "int8"
    (bad_dtype / "config.json").write_text(json.dumps(config))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"dtype":\n')
    cases: list[tuple[tuple[Path, Path, str], list[str]]] = [
        ((model_dir, prompts, "nope"), ["unknown runtime 'nope'", "hf, vllm-hf"]),
        (
            (model_dir, tmp_path / "absent.json", "hf"),
            [str(tmp_path / "absent.json"), "no such prompt file"],
        ),
        ((model_dir, not_json, "hf"), [f"{not_json}:3:", "not JSON"]),
        ((model_dir, empty, "hf"), [str(empty), "expected a prompt file"]),
        (
            (model_dir, out_of_vocab, "hf"),
            ["$.identity.prompts.file<vocab.json>[1][1]", "token id 5000"],
        ),
        ((no_config, prompts, "hf"), [str(no_config / "config.json"), "no such file"]),
        ((bad_dtype, prompts, "hf"), [str(bad_dtype / "config.json"), 'dtype is "int8"']),
        ((broken, prompts, "hf"), [f"{broken / 'config.json'}:2:", "not JSON"]),
    ]
    for (checkpoint, prompt_file, runtime), needles in cases:
        output = tmp_path / "experiment.json"
        code, _, err = _init(checkpoint, prompt_file, output, runtime)
        _one_line_error(code, err, *needles)
        assert not output.exists(), needles
    code, _, err = _init(model_dir, prompts, tmp_path / "no-dir" / "experiment.json", "hf")
    _one_line_error(code, err, "no-dir", "does not exist")


def test_an_intervention_description_must_be_a_string(
    llama: tuple[Path, Path], tmp_path: Path
) -> None:
    output = tmp_path / "experiment.json"
    assert _init(*llama, output, "hf")[0] == 0
    document = json.loads(output.read_text())
    document["interventions"][0]["description"] = 7
    output.write_text(json.dumps(document))
    code, _, err = cli("plan", output)
    _one_line_error(code, err, "$.interventions[0].description", "expected a string")


def test_a_cuda_starter_says_when_the_runtime_does_not_execute_it(
    llama: tuple[Path, Path], tmp_path: Path
) -> None:
    output = tmp_path / "experiment.json"
    code, out, err = _init(*llama, output, "vllm-hf", "--device", "cuda")
    assert code == 0, err
    assert json.loads(output.read_text())["scenario"] == {"level": "S1", "device": "cuda"}
    info = runtime_catalog().get("vllm-hf")
    if "cuda" in info.devices:
        assert "plan-only" not in out
    else:
        assert (
            "note: every case is plan-only: scenario S1 on cuda is plan-only for runtime 'vllm-hf'"
            in out
        )
    code, planned, err = cli("plan", output, "--json")
    assert code == 0, err
    assert len(json.loads(planned)["cases"]) == 1 + sum(
        len(i["values"]) for i in json.loads(output.read_text())["interventions"]
    )
