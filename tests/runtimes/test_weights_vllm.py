"""The weight check on real engines: every case of an S1-style ``vllm-hf`` run seals both
sides' weight digests, and they are what an independent reading gives.

One run, shared by the tests (module-scoped): the tiny Qwen2 (tied embeddings) rebuilt here with
a vocabulary of 1030 rows, which vLLM pads (to 1088, a multiple of its padding of 64, so that TP
2 gives each rank 544 rows: rank 1 holds rows 544..1029 and 58 padding rows). Baseline TP 2 in
float32; cases TP 1, bfloat16 rollout, FSDP training and the test-only
``smoke_only.rollout_weight_perturbation`` (one element of the last TP rank's embedding shard
changed). What must show: every case seals both documents and ``verify`` accepts them; every
checkpoint digest, whole and per rank slice, equals ``hashlib`` over the safetensors tensors cast
with plain torch here; every side equals the checkpoint except the perturbed case, which is
INVALID_IDENTITY naming ``model.embed_tokens.weight``, the rollout side and TP rank 1; and a
plain ``vllm.LLM`` read through its own ``collective_rpc`` holds, per rank, exactly the
embedding and norm rows the sealed slice digests describe (its linear layers are empty: the
CPU build packed them after loading, which is why the project digests before that step).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from drift_testing import S1, cli, skip_unless_installed  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint  # noqa: E402
from pytest_logprob_drift.runtimes.vllm.processes import construction_env  # noqa: E402

skip_unless_installed("vllm")

pytestmark = pytest.mark.slow

VOCAB = 1030
PERTURB = "logp.backend=smoke_only.rollout_weight_perturbation"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _sha(tensor: Any) -> str:
    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2 with its tied embedding resized to 1030 rows (seeded), saved as a local
    checkpoint with the tiny build's tokenizer files."""
    from transformers import AutoModelForCausalLM

    source = resolve_checkpoint("tiny://qwen2-h64-v1", expected_digest=None).path
    target = tmp_path_factory.mktemp("qwen2-v1030") / "ckpt"
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, local_files_only=True)
    torch.manual_seed(1030)
    model.resize_token_embeddings(VOCAB, mean_resizing=False)
    model.save_pretrained(target)
    for path in source.iterdir():
        if path.name.startswith("tokenizer") or path.name in (
            "special_tokens_map.json",
            "chat_template.jinja",
        ):
            shutil.copy(path, target / path.name)
    assert model.config.tie_word_embeddings
    return target


@pytest.fixture(scope="module")
def run(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("weights-run")
    document: dict[str, Any] = json.loads(S1.read_text())
    document["experiment_id"] = "s1-weights"
    document["identity"]["checkpoint"] = {"uri": str(checkpoint), "model_version": "qwen2-v1030"}
    document["identity"]["tokenizer"] = {"id": "qwen2-v1030", "add_special_tokens": False}
    document["identity"]["sampling"]["max_new_tokens"] = 4
    document["baseline"]["rollout"]["tensor_parallel_size"] = 2
    document["interventions"] = [
        {"path": "rollout.tensor_parallel_size", "values": [1]},
        {"path": "rollout.dtype", "values": ["bfloat16"]},
        {"path": "training.sharding", "values": ["fsdp"]},
        {"path": "logp.backend", "values": ["smoke_only.rollout_weight_perturbation"]},
    ]
    config = work / "s1.json"
    config.write_text(json.dumps(document))
    code, out, err = cli(
        "run",
        config,
        "--runtime",
        "vllm-hf",
        "--allow-smoke-operators",
        "--artifacts",
        work / "runs",
    )
    run_dir = work / "runs" / "s1-weights"
    cases: dict[str, Path] = {}
    for path in (run_dir / "cases").glob("*/*/comparison.json"):
        cases[json.loads(path.read_text())["label"]] = path.parent
    return {"code": code, "out": out, "err": err, "run_dir": run_dir, "cases": cases}


def _docs(attempt: Path) -> dict[str, dict[str, Any]]:
    return {
        side: json.loads((attempt / f"weights_{side}.json").read_text())
        for side in ("rollout", "training")
    }


def test_every_case_seals_both_sides_and_verify_accepts_them(run: dict[str, Any]) -> None:
    assert set(run["cases"]) == {
        "baseline",
        "rollout.tensor_parallel_size=1",
        "rollout.dtype=bfloat16",
        "training.sharding=fsdp",
        PERTURB,
    }, run["out"][-3000:] + run["err"][-3000:]
    for label, attempt in run["cases"].items():
        docs = _docs(attempt)
        assert docs["rollout"]["runtime"] == "vllm", label
        expected = "transformers-fsdp" if label == "training.sharding=fsdp" else "transformers"
        assert docs["training"]["runtime"] == expected
        assert docs["rollout"]["refused"] is None and docs["training"]["refused"] is None
        assert docs["rollout"]["tied"] == [
            {"name": "lm_head.weight", "shares": "model.embed_tokens.weight"}
        ]
    code, out, _ = cli("verify", run["run_dir"])
    assert code == 0, out
    assert "0 invalid" in out


def test_every_digest_is_hashlib_over_the_checkpoint_cast_with_torch(
    run: dict[str, Any], checkpoint: Path
) -> None:
    stored: dict[str, Any] = {}
    for path in sorted(checkpoint.glob("*.safetensors")):
        stored.update(load_file(str(path)))
    assert stored["model.embed_tokens.weight"].shape[0] == VOCAB
    seen_slices = 0
    for label, attempt in run["cases"].items():
        for side, doc in _docs(attempt).items():
            dtype = DTYPES[doc["dtype"]]
            assert {t["name"] for t in doc["tensors"]} == set(stored), (label, side)
            for t in doc["tensors"]:
                cast = stored[t["name"]].to(dtype)
                assert t["checkpoint"] == _sha(cast), (label, side, t["name"])
                if label != PERTURB or side != "rollout":
                    assert t["side"] == t["checkpoint"], (label, side, t["name"])
                for s in t["slices"]:
                    rows = cast.narrow(s["dim"], s["start"], s["stop"] - s["start"])
                    assert s["checkpoint"] == _sha(rows)
                    seen_slices += 1
            if label != PERTURB:
                assert doc["differences"] == [], (label, side)
    assert seen_slices > 0
    tp2 = _docs(run["cases"]["baseline"])["rollout"]
    embed = next(t for t in tp2["tensors"] if t["name"] == "model.embed_tokens.weight")
    assert [(s["rank"], s["start"], s["stop"]) for s in embed["slices"]] == [
        (0, 0, 544),
        (1, 544, VOCAB),
    ]


def test_the_perturbed_rank_is_invalid_identity_naming_tensor_side_and_rank(
    run: dict[str, Any],
) -> None:
    attempt = run["cases"][PERTURB]
    comparison = json.loads((attempt / "comparison.json").read_text())
    assert comparison["outcome"] == "INVALID_IDENTITY"
    rollout = _docs(attempt)["rollout"]
    found = [(d["name"], d["side"], d["rank"], d["kind"]) for d in rollout["differences"]]
    assert found == [
        ("model.embed_tokens.weight", "rollout", None, "values"),
        ("model.embed_tokens.weight", "rollout", 1, "slice"),
    ]
    assert any(
        v.startswith(
            "weights (rollout, TP rank 1): model.embed_tokens.weight: slice: rows [544, 1030)"
        )
        for v in comparison["identity_violations"]
    ), comparison["identity_violations"]
    assert _docs(attempt)["training"]["differences"] == []
    code, out, _ = cli("report", run["run_dir"], "--verbose")
    assert code == 0
    assert (
        f"{PERTURB}: weights (rollout): 2 difference(s) in 26 tensors: "
        "model.embed_tokens.weight: values" in out
    )
    assert (
        "baseline: weights (rollout): 26 tensors, all equal to the checkpoint cast to float32"
        in out
    )


def _read_worker(self: Any) -> dict[str, Any]:
    """Run in each worker of a plain ``vllm.LLM`` (no extension): this rank's tensors."""
    from vllm.distributed.parallel_state import get_tp_group

    model = self.model_runner.model
    return {
        "rank": int(get_tp_group().rank_in_group),
        "tensors": {n: p.detach().cpu().clone() for n, p in model.named_parameters()},
    }


def test_a_plain_vllm_engine_holds_the_rows_the_sealed_slices_describe(
    run: dict[str, Any], checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm import LLM

    # A function (not a method name) goes to the workers pickled.
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    # Only the environment a CPU TP-2 build needs (one CPU group per rank), nothing of the
    # project's engine or weight code.
    with construction_env(tensor_parallel_size=2, is_cpu=True):
        llm = LLM(
            model=str(checkpoint),
            skip_tokenizer_init=True,
            dtype="bfloat16",
            tensor_parallel_size=2,
            enforce_eager=True,
            max_model_len=64,
            kv_cache_memory_bytes=32 * 1024 * 1024,
        )
    try:
        replies = sorted(llm.collective_rpc(_read_worker), key=lambda r: r["rank"])
    finally:
        llm.llm_engine.engine_core.shutdown()
    stored = {}
    for path in sorted(checkpoint.glob("*.safetensors")):
        stored.update(load_file(str(path)))
    embed = stored["model.embed_tokens.weight"].to(torch.bfloat16)
    # vLLM pads 1030 rows to 1088 (a multiple of 64) and gives each of 2 ranks 544.
    shards = [r["tensors"]["model.embed_tokens.weight"] for r in replies]
    assert [tuple(s.shape) for s in shards] == [(544, 128), (544, 128)]
    assert torch.equal(shards[0], embed[:544])
    assert torch.equal(shards[1][: VOCAB - 544], embed[544:])
    sealed = _docs(run["cases"]["rollout.dtype=bfloat16"])["rollout"]
    by_name = {t["name"]: t for t in sealed["tensors"]}
    slices = by_name["model.embed_tokens.weight"]["slices"]
    assert slices[0]["side"] == _sha(shards[0])
    assert slices[1]["side"] == _sha(shards[1][: VOCAB - 544])
    assert by_name["model.embed_tokens.weight"]["side"] == _sha(
        torch.cat([shards[0], shards[1][: VOCAB - 544]])
    )
    for reply in replies:
        norm = reply["tensors"]["model.norm.weight"]
        assert _sha(norm) == by_name["model.norm.weight"]["side"]
        qkv = reply["tensors"]["model.layers.0.self_attn.qkv_proj.weight"]
        if qkv.numel() == 0:
            continue  # the CPU build packed the linear weight after loading (oneDNN)
        # Where oneDNN has no bf16 linear for this CPU (an AVX2-only one: "Failed to create
        # oneDNN linear, fallback to torch linear"), vLLM keeps the weight: this rank's rows.
        assert torch.equal(qkv, _qkv_rows(stored, checkpoint, reply["rank"], tp=2))


def _qkv_rows(stored: dict[str, Any], checkpoint: Path, rank: int, tp: int) -> Any:
    """Layer 0's fused q, k, v rows that TP rank ``rank`` of ``tp`` holds, in bfloat16, from
    the checkpoint's tensors: its share of the query heads, then the k and v rows of its
    key-value head (shared by ``tp // kv_heads`` ranks where there are fewer kv heads)."""
    config = json.loads((checkpoint / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    q, k, v = (
        stored[f"model.layers.0.self_attn.{p}_proj.weight"].to(torch.bfloat16) for p in "qkv"
    )
    q_rows = heads // tp * head_dim
    if kv_heads >= tp:
        kv = slice(rank * kv_heads // tp * head_dim, (rank + 1) * kv_heads // tp * head_dim)
    else:
        head = rank * kv_heads // tp
        kv = slice(head * head_dim, (head + 1) * head_dim)
    return torch.cat([q[rank * q_rows : (rank + 1) * q_rows], k[kv], v[kv]])
