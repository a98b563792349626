"""``rollout.weight_sync`` on real runs of the ``vllm-hf`` runtime.

Agreement: the shipped experiment (``cross_config_s1_vllm_cpu_weight_sync.json``, tiny Qwen2
with its LM head tied to the embedding; TP 1 and 2, unsharded and FSDP2 trainers, float32 and
bfloat16 rollouts) is run once for the module with ``--pairwise``, its push values cut to
``trainer`` (8 cases, listed exactly): a push into a TP 2 engine, from an FSDP trainer and
into a bfloat16 engine each needs one case, and ``trainer_refit`` is run once, in the stale
cache run below, not again beside each of them. Every push case must have the verdict of, and
seal bitwise the rollout scores of, the case that loads the checkpoint from disk with the same
other knobs; the scores are read here from the sealed tensors (``torch.load(weights_only=True)``),
never from the tool's own comparison. ``verify`` passes on both runs.

The stale prefix cache and the planted pushes share one run: prompts longer than one KV-cache
block (128 tokens on the CPU build), prefix caching on, a correct refit against the planted one
that skips the reset after the push, and the three planted weight values (each
INVALID_IDENTITY naming the tensor); run with ``--replay`` so that the path split is there to
read. The planted reset is not a PASS; the prefill replay (which never reads the prefix cache)
agrees with the trainer as the correct refit does, the decode path does not, and the read-back
says how many prompt tokens were served from cache blocks computed under the previous policy.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import EXPERIMENTS, cli, experiment_config, skip_unless_installed
from text_in_strings import text_in_strings

from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint

skip_unless_installed("vllm")

pytestmark = pytest.mark.slow

SHIPPED = EXPERIMENTS / "cross_config_s1_vllm_cpu_weight_sync.json"
OTHERS = (
    None,
    "rollout.tensor_parallel_size=2",
    "training.sharding=fsdp",
    "rollout.dtype=bfloat16",
)
PLANTED = ("planted:drop_tied_embedding", "planted:through_float16", "planted:stale_tensor")


def _load(path: Path) -> dict[str, torch.Tensor]:
    loaded = torch.load(path, weights_only=True, map_location="cpu")
    assert isinstance(loaded, dict)
    return loaded


def _label(other: str | None, sync: str | None) -> str:
    parts = [p for p in (other, None if sync is None else f"rollout.weight_sync={sync}") if p]
    return ",".join(parts) if parts else "baseline"


def _run(config: Path, artifacts: Path, *extra: str) -> dict[str, Any]:
    code, out, err = cli(
        "run", config, "--runtime", "vllm-hf", "--artifacts", artifacts, "--json", *extra
    )
    table = json.loads(out)
    results = {r["label"]: r for r in table["results"]}
    return {"code": code, "err": err, "results": results, "artifacts": artifacts}


def _actual(result: Mapping[str, Any]) -> dict[str, Any]:
    document = json.loads((Path(result["attempt_dir"]) / "actual.json").read_text())
    read_back: dict[str, Any] = document["read_back"]
    return read_back


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("weight-sync")
    interventions = json.loads(SHIPPED.read_text())["interventions"]
    assert interventions[0] == {
        "path": "rollout.weight_sync",
        "values": ["trainer", "trainer_refit"],
    }
    config = experiment_config(
        work,
        SHIPPED,
        {
            "interventions": [
                {"path": "rollout.weight_sync", "values": ["trainer"]},
                *interventions[1:],
            ]
        },
    )
    return _run(config, work / "runs", "--pairwise")


def _push_cases(
    shipped: Mapping[str, Any], stale: Mapping[str, Any]
) -> list[tuple[str | None, str, Mapping[str, Any], Mapping[str, Any]]]:
    """(other knob, push, the checkpoint case, the push case) for every push case of the two
    runs: ``trainer`` beside each other knob (shipped run), ``trainer_refit`` on the baseline
    (stale cache run)."""
    results, refit = shipped["results"], stale["results"]
    cases: list[tuple[str | None, str, Mapping[str, Any], Mapping[str, Any]]] = [
        (other, "trainer", results[_label(other, None)], results[_label(other, "trainer")])
        for other in OTHERS
    ]
    cases.append(
        (None, "trainer_refit", refit["baseline"], refit["rollout.weight_sync=trainer_refit"])
    )
    return cases


def test_every_case_ran_and_verify_passes(shipped: dict[str, Any]) -> None:
    results = shipped["results"]
    assert sorted(results) == sorted(
        _label(other, sync) for other in OTHERS for sync in (None, "trainer")
    )
    for label, result in results.items():
        assert result["attempt_dir"], label
    code, out, err = cli("verify", shipped["artifacts"] / "s1-vllm-cpu-weight-sync")
    assert code == 0, out + err


def test_push_cases_agree_bitwise_with_the_checkpoint_case(
    shipped: dict[str, Any], stale: dict[str, Any]
) -> None:
    for other, sync, loaded, pushed in _push_cases(shipped, stale):
        reference = _load(Path(loaded["attempt_dir"]) / "score_rollout.pt")
        assert pushed["outcome"] == loaded["outcome"], _label(other, sync)
        assert pushed["mismatches"] == loaded["mismatches"]
        scores = _load(Path(pushed["attempt_dir"]) / "score_rollout.pt")
        assert set(scores) == set(reference)
        for name, tensor in reference.items():
            assert torch.equal(scores[name], tensor), (_label(other, sync), name)
        # The pushed engine's weight digests (taken after the push) equal the checkpoint's.
        document = _weights(pushed)
        assert document["differences"] == [], _label(other, sync)
        assert "push" in document["point"]


def test_actual_json_holds_no_format_inside_a_string(shipped: dict[str, Any]) -> None:
    """``actual.json`` v2: the read-back of a ``weight_sync=trainer`` case (the weights that
    arrived, the sampling applied, the logp injection) and the hf FSDP trainer's evidence
    (per-rank lists and objects) are nested JSON; no string holds JSON or a Python literal."""
    results = shipped["results"]
    walked = []
    for label in (
        "rollout.weight_sync=trainer",
        "training.sharding=fsdp,rollout.weight_sync=trainer",
        "training.sharding=fsdp",
    ):
        document = json.loads((Path(results[label]["attempt_dir"]) / "actual.json").read_text())
        assert document["schema_version"] == "cross_config.actual.v2"
        assert text_in_strings(document) == [], label
        walked.append(document)
    pushed, fsdp_pushed, fsdp = walked
    assert isinstance(pushed["read_back"]["vllm.weights_arrived"], dict)
    assert isinstance(pushed["read_back"]["vllm.sampling_applied"]["values"], list)
    assert isinstance(pushed["read_back"]["vllm.logp_injection"], list)
    for document in (fsdp_pushed, fsdp):
        evidence = document["training_evidence"]
        assert evidence["world_size"] == 2
        assert isinstance(evidence["rank_startup_s"], list)
        assert len(evidence["rank_startup_s"]) == 2


def test_the_read_back_says_how_the_weights_arrived(
    shipped: dict[str, Any], stale: dict[str, Any]
) -> None:
    from safetensors import safe_open

    path = resolve_checkpoint("tiny://qwen2-h64-v1", expected_digest=None).path
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        stored = {k: f.get_slice(k).get_shape() for k in f.keys()}
    assert "lm_head.weight" not in stored  # tied: the file holds the embedding once
    numel = sum(int(torch.tensor(shape).prod()) for shape in stored.values())
    numel += int(torch.tensor(stored["model.embed_tokens.weight"]).prod())  # the tied head
    for other, sync, loaded, pushed in _push_cases(shipped, stale):
        assert _actual(loaded)["rollout.weight_sync"] == "checkpoint"
        actual = _actual(pushed)
        assert actual["rollout.weight_sync"] == sync
        arrived = actual["vllm.weights_arrived"]
        dtype = "bfloat16" if other == "rollout.dtype=bfloat16" else "float32"
        assert arrived["rollout_dtype"] == dtype
        assert arrived["tensor_bytes"] == numel * (2 if dtype == "bfloat16" else 4)
        assert arrived["tensors"] == len(stored) + 1
        assert arrived["chunks"] > 1 and arrived["seconds"] > 0
        assert arrived["tie_groups"] == [["model.embed_tokens.weight", "lm_head.weight"]]
        assert arrived["left_out"] == []
        assert arrived["not_loaded_by_vllm"] == []
        tp = 2 if other == "rollout.tensor_parallel_size=2" else 1
        assert len(arrived["loaded_by_vllm"]) == tp
        world = 2 if other == "training.sharding=fsdp" else 1
        assert arrived["source_evidence"]["world_size"] == world
        if world == 2:
            assert arrived["source_evidence"]["ranks_agree"] is True
        assert ("previous_policy" in arrived) == (sync == "trainer_refit")


# --------------------------------------------------------------------------- stale prefix cache

LONG = 150
"""Prompt tokens: more than one 128-token KV-cache block, so a block can be cached."""


def _stale_config(work: Path) -> Path:
    document: dict[str, Any] = copy.deepcopy(json.loads(SHIPPED.read_text()))
    document["experiment_id"] = "weight-sync-stale-cache"
    document["identity"]["prompts"] = {
        "token_ids": [
            [300 + (7 * i) % 600 for i in range(LONG)],
            [310 + (11 * i) % 600 for i in range(LONG + 9)],
        ]
    }
    document["baseline"]["batch"]["size"] = 2
    document["baseline"]["rollout"]["enable_prefix_caching"] = True
    document["interventions"] = [
        {
            "path": "rollout.weight_sync",
            "values": ["trainer_refit", "planted:keep_prefix_cache", *PLANTED],
        }
    ]
    document.pop("pairs")
    document["strategy"] = "one_at_a_time"
    path = work / "stale.json"
    path.write_text(json.dumps(document))
    return path


@pytest.fixture(scope="module")
def stale(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("stale-cache")
    return _run(_stale_config(work), work / "runs", "--replay", "--allow-smoke-operators")


def test_a_skipped_reset_after_a_refit_serves_stale_cache_and_the_report_shows_it(
    stale: dict[str, Any],
) -> None:
    results = stale["results"]
    base = results["baseline"]
    refit = results["rollout.weight_sync=trainer_refit"]
    planted = results["rollout.weight_sync=planted:keep_prefix_cache"]
    assert base["outcome"] == refit["outcome"] == "PASS"
    assert planted["outcome"] != "PASS"
    # The correct refit seals bitwise what the checkpoint engine seals; the planted one not.
    reference = _load(Path(base["attempt_dir"]) / "score_rollout.pt")
    correct = _load(Path(refit["attempt_dir"]) / "score_rollout.pt")
    wrong = _load(Path(planted["attempt_dir"]) / "score_rollout.pt")
    assert torch.equal(correct["logprobs"], reference["logprobs"])
    assert not torch.equal(wrong["logprobs"], reference["logprobs"])
    # What the read-back says: the weights were pushed, the reset was skipped, and the scored
    # rollout's prompts were served from cache blocks (computed under the previous policy).
    for result, reset in ((refit, True), (planted, False)):
        actual = _actual(result)
        arrived = actual["vllm.weights_arrived"]
        assert arrived["enable_prefix_caching"] is True
        assert arrived["prefix_cache_reset"] is reset
        assert arrived["previous_policy"]["served_prompts"] == 2
        assert actual["vllm.prompt_tokens_cached"] == (0 if reset else 2 * 128)
    assert "not reset" in _actual(planted)["vllm.weights_arrived"]["planted"]
    # The path split: the prefill replay (which never reads the prefix cache) agrees with the
    # trainer on the planted case as on the correct one; the decode path does not.
    comparison = json.loads((Path(planted["attempt_dir"]) / "comparison.json").read_text())
    figures = comparison["diagnostics"]["path_split"]["figures"]
    good = json.loads((Path(refit["attempt_dir"]) / "comparison.json").read_text())
    good_figures = good["diagnostics"]["path_split"]["figures"]
    loaded = json.loads((Path(base["attempt_dir"]) / "comparison.json").read_text())
    loaded_figures = loaded["diagnostics"]["path_split"]["figures"]
    threshold = comparison["threshold"]
    assert figures["prefill_training"]["max"] < threshold
    assert good_figures["prefill_training"]["max"] < threshold
    assert figures["decode_prefill"]["max"] > threshold
    # a correct refit's decode path is the checkpoint-loaded engine's, whatever this CPU's
    # kernels make of decode against prefill
    assert good_figures["decode_prefill"] == loaded_figures["decode_prefill"]
    assert good_figures["first_difference"] == loaded_figures["first_difference"]
    # The very first sampled token already differs: its logits read the stale KV blocks.
    assert figures["first_difference"] == [0, 0]
    # What a reader of the report is told, in one finding: the decode path only, the reset
    # skipped, prompt tokens read from cache blocks computed before the push.
    code, out, err = cli("report", stale["artifacts"] / "weight-sync-stale-cache")
    assert code == 0, err
    finding = next(line for line in out.splitlines() if "planted:keep_prefix_cache moved" in line)
    assert "path: moved the rollout's decode path only" in finding
    assert "prefix cache NOT reset after the push" in finding
    assert "256 prompt tokens of the scored rollout read from the prefix cache" in finding
    assert "stale cached state, not the weights" in finding


# --------------------------------------------------------------------------- planted weights


def _weights(result: Mapping[str, Any]) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(
        (Path(result["attempt_dir"]) / "weights_rollout.json").read_text()
    )
    return document


def test_a_correct_push_seals_digests_equal_to_the_checkpoint(shipped: dict[str, Any]) -> None:
    results = shipped["results"]
    for label in ("baseline", "rollout.weight_sync=trainer"):
        assert results[label]["outcome"] == "PASS", results[label]["reason"]
        document = _weights(results[label])
        assert document["differences"] == [], label
    pushed = _weights(results["rollout.weight_sync=trainer"])
    loaded = _weights(results["baseline"])
    assert "push" in pushed["point"] and "push" not in loaded["point"]
    assert {t["name"]: t["side"] for t in pushed["tensors"]} == {
        t["name"]: t["side"] for t in loaded["tensors"]
    }


def test_every_planted_push_ends_invalid_identity_naming_the_tensor(
    stale: dict[str, Any],
) -> None:
    from pytest_logprob_drift.plan.planted_sync import EMBEDDING, STALE_TENSOR

    results = stale["results"]
    assert sorted(results) == sorted(
        [
            "baseline",
            "rollout.weight_sync=trainer_refit",
            "rollout.weight_sync=planted:keep_prefix_cache",
            *(f"rollout.weight_sync={name}" for name in PLANTED),
        ]
    )
    expected = {
        "planted:drop_tied_embedding": {EMBEDDING},
        "planted:stale_tensor": {STALE_TENSOR},
    }
    for name, tensors in expected.items():
        result = results[f"rollout.weight_sync={name}"]
        assert result["outcome"] == "INVALID_IDENTITY", name
        named = {d["name"] for d in _weights(result)["differences"]}
        assert named == tensors, name
        assert all(t in result["reason"] for t in tensors)
    half = results["rollout.weight_sync=planted:through_float16"]
    assert half["outcome"] == "INVALID_IDENTITY"
    named = {d["name"] for d in _weights(half)["differences"]}
    assert STALE_TENSOR in named and len(named) > 10
    code, out, err = cli("verify", stale["artifacts"] / "weight-sync-stale-cache")
    assert code == 0, out + err
