"""Replay on the ``vllm-hf`` runtime (issue 22): the shipped S1 bf16 experiment with
``diagnostics.replay`` on and off, one run each for the whole module (the one without replay
runs its baseline twice, and its sealed attribution carries the structural truths of
``attribution_structure`` on vLLM).

The figures and the float64 identity are checked against the sealed tensors, the evidence
against what vLLM reports, and the verdicts against the run without replay. vLLM's decode
replay is refused by its CPU build: the record says so. (The sealed prefill replay against a
plain ``vllm.LLM`` built in the test, ``prompt_logprobs=0`` in the run's chunks, is in
``test_vllm_runtime.py``, on the plain bfloat16 engine that module starts anyway.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from attribution_structure import assert_structure
from drift_testing import EXPERIMENTS, cli, skip_unless_installed

from pytest_logprob_drift.attribution.sealed import verify_attribution

skip_unless_installed("vllm")

pytestmark = pytest.mark.slow

CONFIG = EXPERIMENTS / "cross_config_s1_vllm_cpu_tiny_bf16.json"
PREFILL = "score_rollout_prefill.pt"


def _load(path: Path) -> dict[str, torch.Tensor]:
    loaded: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return loaded


def _run(directory: Path, replay: bool, *extra: str) -> dict[str, Any]:
    config = json.loads(CONFIG.read_text())
    if replay:
        config["diagnostics"] = {"replay": True}
    path = directory / CONFIG.name
    path.write_text(json.dumps(config))
    artifacts = directory / "runs"
    code, out, err = cli("run", path, "--runtime", "vllm-hf", "--artifacts", artifacts, *extra)
    assert code == 1, out[-3000:] + err[-3000:]  # bf16: every case is a MISMATCH under ws1
    run_dir = artifacts / config["experiment_id"]
    cases = {}
    for comparison in (run_dir / "cases").glob("*/*/comparison.json"):
        document = json.loads(comparison.read_text())
        cases[document["label"]] = {"comparison": document, "attempt": comparison.parent}
    return {"out": out, "cases": cases, "run_dir": run_dir}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return {
        "on": _run(tmp_path_factory.mktemp("replay-on"), True),
        "off": _run(tmp_path_factory.mktemp("replay-off"), False, "--baseline-repeats", "2"),
    }


def test_every_case_carries_the_split_with_the_engines_evidence(
    runs: dict[str, dict[str, Any]],
) -> None:
    on = runs["on"]
    assert len(on["cases"]) == 7
    for label, case in on["cases"].items():
        split = case["comparison"]["diagnostics"]["path_split"]
        prefill = split["prefill"]
        assert prefill["status"] == "replay_ran", label
        evidence = prefill["evidence"]
        assert evidence["logprob_semantics"] == "raw"
        assert evidence["num_cached_tokens"] == 0, label  # no prefix-cache reuse
        assert evidence["skip_reading_prefix_cache"] is True
        knobs = json.loads((case["attempt"] / "requested.json").read_text())["knobs"]
        assert evidence["batch_size"] == knobs["batch.size"]
        assert evidence["enable_prefix_caching"] == knobs["rollout.enable_prefix_caching"]
        assert evidence["prefix_cache_reset_after"] is evidence["enable_prefix_caching"]
        # vLLM 0.32's CPU build has no decode replay: recorded with vLLM's reason, not skipped
        assert split["decode_replay"]["status"] == "replay_unavailable"
        assert "trace replay requires Model Runner V2" in split["decode_replay"]["reason"]
        assert not (case["attempt"] / "score_rollout_decode_replay.pt").exists()
        # the three differences satisfy the identity exactly, and the figures are theirs
        rollout = _load(case["attempt"] / "score_rollout.pt")
        training = _load(case["attempt"] / "score_training.pt")
        replay = _load(case["attempt"] / PREFILL)
        active = rollout["active_mask"]
        assert torch.equal(
            replay["token_ids"][rollout["attention_mask"]],
            rollout["token_ids"][rollout["attention_mask"]],
        )
        d, p, t = (x["logprobs"].double()[active] for x in (rollout, replay, training))
        assert torch.equal(d - t, (d - p) + (p - t)), label
        figures = split["figures"]
        for pair, diff in (
            ("decode_prefill", d - p),
            ("prefill_training", p - t),
            ("decode_training", d - t),
        ):
            assert figures[pair]["max"] == float(diff.abs().max()), (label, pair)
        assert (
            figures["decode_training"]["max"] == case["comparison"]["diagnostics"]["max_abs_diff"]
        )


def test_replay_changes_no_verdict_mismatch_count_or_case_id(
    runs: dict[str, dict[str, Any]],
) -> None:
    on, off = runs["on"]["cases"], runs["off"]["cases"]
    assert set(on) == set(off)
    for label in on:
        a, b = on[label]["comparison"], off[label]["comparison"]
        for key in ("case_id", "outcome", "mismatches", "active_tokens", "numerical"):
            assert a[key] == b[key], (label, key)
        assert "path_split" not in b["diagnostics"]


def test_verify_and_the_attribution_by_path(runs: dict[str, dict[str, Any]]) -> None:
    on = runs["on"]
    code, out, err = cli("verify", on["run_dir"])
    assert code == 0, out[-3000:] + err[-2000:]
    assert "max|dec-pre|" in on["out"] and "where the drift entered" in on["out"]
    document = json.loads(
        sorted((on["run_dir"] / "attributions").glob("*/attribution.json"))[-1].read_text()
    )
    base = _load(on["cases"]["baseline"]["attempt"] / PREFILL)["logprobs"]
    for entry in document["cases"]:
        case = on["cases"][entry["label"]]
        prefill = _load(case["attempt"] / PREFILL)["logprobs"]
        rollout = _load(case["attempt"] / "score_rollout.pt")
        reference = _load(on["cases"]["baseline"]["attempt"] / "score_rollout.pt")
        if torch.equal(rollout["token_ids"], reference["token_ids"]):
            # same sampled tokens: the prefill path moved iff the replays differ anywhere
            moved = not torch.equal(prefill, base)
            assert (entry["path"]["prefill"]["max_abs_delta"] > 0) is moved, entry["label"]


def test_the_bf16_attribution_separates_the_sides_on_vllm(
    runs: dict[str, dict[str, Any]],
) -> None:
    off = runs["off"]
    assert {c["comparison"]["outcome"] for c in off["cases"].values()} == {"MISMATCH"}
    baseline = off["cases"]["baseline"]["attempt"]
    assert len(list(baseline.parent.glob("*/comparison.json"))) == 2  # the baseline, repeated
    run_dir = off["run_dir"]
    (directory,) = sorted((run_dir / "attributions").iterdir())
    assert verify_attribution(run_dir, directory) == []
    document = json.loads((directory / "attribution.json").read_text())
    assert_structure(
        {c["label"]: c for c in document["cases"]} | {"_doc": document},
        training_only="training.compute_dtype=float32",
        rollout_only="rollout.dtype=float32",
        no_op="rollout.enable_prefix_caching=true",
    )
