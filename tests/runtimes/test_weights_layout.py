"""The weight digests' pure parts: vLLM's fused/sharded/padded layout arithmetic, and the
training side's digests of a real transformers model, each against an independent
computation written here (explicit head indexing, ``hashlib`` over the safetensors file's
tensors cast with plain torch)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint
from pytest_logprob_drift.runtimes.weights.module_digests import module_report
from pytest_logprob_drift.runtimes.weights.vllm_layout import (
    merged_rows,
    qkv_rows,
    split_rows,
    vocab_rows,
)


def _sha(tensor: torch.Tensor) -> str:
    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


def _fused_qkv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    heads: int,
    kv: int,
    d: int,
    tp: int,
    rank: int,
) -> torch.Tensor:
    """What a TP rank's fused qkv weight holds, built head by head (vLLM's documented order:
    this rank's q heads, then its k heads, then its v heads; KV heads replicated when TP
    exceeds them)."""
    q_per = heads // tp
    q_heads = [q[h * d : (h + 1) * d] for h in range(rank * q_per, (rank + 1) * q_per)]
    if tp >= kv:
        kv_heads = [rank * kv // tp]
    else:
        per = kv // tp
        kv_heads = list(range(rank * per, (rank + 1) * per))
    k_rows = [k[h * d : (h + 1) * d] for h in kv_heads]
    v_rows = [v[h * d : (h + 1) * d] for h in kv_heads]
    return torch.cat([*q_heads, *k_rows, *v_rows])


@pytest.mark.parametrize(
    ("heads", "kv", "tp"), [(4, 2, 2), (2, 1, 2), (4, 4, 4), (8, 2, 4), (4, 1, 1)]
)
def test_qkv_split_by_heads_times_head_size(heads: int, kv: int, tp: int) -> None:
    d, hidden = 3, 5
    q = torch.arange(heads * d * hidden, dtype=torch.float32).reshape(heads * d, hidden)
    k = -torch.arange(kv * d * hidden, dtype=torch.float32).reshape(kv * d, hidden) - 1
    v = 1000 + torch.arange(kv * d * hidden, dtype=torch.float32).reshape(kv * d, hidden)
    full = {"q": q, "k": k, "v": v}
    for rank in range(tp):
        fused = _fused_qkv(q, k, v, heads, kv, d, tp, rank)
        for shard in ("q", "k", "v"):
            span = qkv_rows(
                num_heads=heads // tp,
                num_kv_heads=max(kv // tp, 1),
                head_size=d,
                v_head_size=d,
                num_kv_head_replicas=max(tp // kv, 1),
                tp_rank=rank,
                shard=shard,
            )
            held = fused[span.local_start : span.local_stop]
            assert torch.equal(held, full[shard][span.start : span.stop]), (rank, shard)


def test_gate_up_split_by_output_sizes() -> None:
    gate = torch.arange(8 * 3, dtype=torch.float32).reshape(8, 3)
    up = 100 + torch.arange(8 * 3, dtype=torch.float32).reshape(8, 3)
    for rank in range(2):
        fused = torch.cat([gate[rank * 4 : rank * 4 + 4], up[rank * 4 : rank * 4 + 4]])
        for shard, source in ((0, gate), (1, up)):
            span = merged_rows([8, 8], 2, rank, shard)
            assert torch.equal(
                fused[span.local_start : span.local_stop], source[span.start : span.stop]
            )


def test_row_parallel_columns() -> None:
    span = split_rows(64, 1, 1)
    assert (span.local_dim, span.dim, span.start, span.stop) == (1, 1, 64, 128)


def test_vocab_padding_rows_are_left_out() -> None:
    # 1000 tokens, padded to a multiple of 64 x TP 2 = 1024, 512 rows per rank: rank 1 holds
    # tokens 512..999 in its first 488 rows and 24 padding rows after them.
    span = vocab_rows(512, 1000)
    assert (span.local_start, span.local_stop, span.start, span.stop) == (0, 488, 512, 1000)


@pytest.fixture(scope="module")
def qwen2() -> Path:
    return resolve_checkpoint("tiny://qwen2-h64-v1", expected_digest=None).path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_module_digests_equal_hashlib_over_the_safetensors_file(
    qwen2: Path, dtype: torch.dtype
) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(qwen2, dtype=dtype, local_files_only=True)
    stored = {}
    for path in sorted(qwen2.glob("*.safetensors")):
        stored.update(load_file(str(path)))
    report = module_report(model, set(stored))
    assert set(report["tensors"]) == set(stored)
    for name, tensor in stored.items():
        entry = report["tensors"][name]
        assert entry["sha256"] == _sha(tensor.to(dtype)), name
        assert entry["shape"] == list(tensor.shape)
    assert report["tied"] == {"lm_head.weight": "model.embed_tokens.weight"}
    assert "lm_head.weight" not in stored
    assert any(name.endswith("rotary_emb.inv_freq") for name in report["skipped"])
    assert report["extra"] == {}


@pytest.mark.parametrize("uri", ["tiny://qwen2-h64-v1", "tiny://qwen3-h64-v1"])
def test_a_float32_head_over_a_bfloat16_body_is_the_checkpoint_through_bfloat16(uri: str) -> None:
    """``lm_head_dtype=float32`` copies the bfloat16-loaded head to float32: its digest is the
    checkpoint's head (or, tied, embedding) cast to bfloat16 and then float32, and the document
    says so; a head that held the checkpoint's float32 values would differ."""
    from pytest_logprob_drift.check.weights_check import summary
    from pytest_logprob_drift.runtimes.transformers.adapter import module_weights
    from pytest_logprob_drift.runtimes.transformers.engine import load_model

    path = resolve_checkpoint(uri, expected_digest=None).path
    model = load_model(path, dtype="bfloat16", attn_implementation="sdpa", lm_head_dtype="float32")
    document = module_weights(
        model, path, side="training", dtype="bfloat16", lm_head_dtype="float32"
    )
    stored = load_file(str(path / "model.safetensors"))
    source = "lm_head.weight" if "lm_head.weight" in stored else "model.embed_tokens.weight"
    head = next(t for t in document.tensors if t.name == "lm_head.weight")
    assert (head.dtype, head.via, head.side_dtype) == ("float32", "bfloat16", "float32")
    assert head.checkpoint == _sha(stored[source].to(torch.bfloat16).to(torch.float32))
    assert head.checkpoint != _sha(stored[source].to(torch.float32))
    assert document.differences == ()
    assert "lm_head.weight" in summary(document)


def test_a_kept_reference_is_the_files_and_a_rewritten_file_is_read_again(
    tmp_path: Path,
) -> None:
    """The checkpoint reference a process keeps equals hashlib over the file's cast tensor;
    a file rewritten with other values is hashed again, never answered from what was kept."""
    from safetensors.torch import save_file

    from pytest_logprob_drift.runtimes.weights.checkpoint import (
        SliceSpan,
        Wanted,
        checkpoint_digests,
    )

    first = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    save_file({"w": first}, str(tmp_path / "model.safetensors"))
    want = Wanted(
        name="w", source="w", dtype=torch.bfloat16, spans=(SliceSpan(dim=0, start=2, stop=4),)
    )
    absent = Wanted(name="x", source="x", dtype=torch.bfloat16)

    def expected(tensor: torch.Tensor) -> tuple[str, tuple[str]]:
        cast = tensor.to(torch.bfloat16)
        return _sha(cast), (_sha(cast[2:4]),)

    for _ in range(2):  # computed, then kept
        found = checkpoint_digests(tmp_path, [want, absent])
        assert set(found) == {"w"}
        assert (found["w"].sha256, found["w"].slices) == expected(first)

    second = first + 100
    save_file({"w": second}, str(tmp_path / "model.safetensors"))
    found = checkpoint_digests(tmp_path, [want])
    assert (found["w"].sha256, found["w"].slices) == expected(second)
    assert found["w"].sha256 != expected(first)[0]
