"""The tiny Llama, Qwen2 and Mistral builds: deterministic, resolvable as ``tiny://NAME``,
declared by both production runtimes with the limits the build has, each with its
per-architecture fields (tied embeddings, no sliding window), head_dim 64 and a chat template
in tokenizer_config.json; the tiny Qwen3 build is unchanged by them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from pytest_logprob_drift.policy import runtime_catalog
from pytest_logprob_drift.runtimes import TINY_ARCHITECTURES as DECLARED
from pytest_logprob_drift.runtimes.tiny_model import (
    MAX_POSITIONS,
    TINY_ARCHITECTURES,
    TINY_MOE_ARCHITECTURES,
    TINY_SCHEME,
    TinyArchitecture,
    build_tiny_architecture,
    checkpoint_digest,
    resolve_checkpoint,
)


@pytest.mark.parametrize("arch", TINY_ARCHITECTURES, ids=lambda a: a.name)
def test_each_build_is_deterministic_and_resolvable(arch: TinyArchitecture, tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    build_tiny_architecture(arch, first)
    build_tiny_architecture(arch, second)
    assert checkpoint_digest(first) == checkpoint_digest(second)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    resolved = resolve_checkpoint(
        TINY_SCHEME + arch.name,
        expected_digest=checkpoint_digest(first),
        cache_root=tmp_path / "cache",
    )
    assert checkpoint_digest(resolved.path) == checkpoint_digest(first)
    config = json.loads((first / "config.json").read_text())
    assert config["architectures"] == [arch.model_class]
    assert config["head_dim"] == 64
    assert config["hidden_size"] // config["num_attention_heads"] == 64
    for key, value in arch.config.items():
        assert config[key] == value, key
    tokenizer_config = json.loads((first / "tokenizer_config.json").read_text())
    assert tokenizer_config["chat_template"] == arch.chat_template
    uri = TINY_SCHEME + arch.name
    declared = {c.uri: c for c in DECLARED}[uri]
    assert (declared.vocab_size, declared.max_positions) == (config["vocab_size"], MAX_POSITIONS)
    assert config["max_position_embeddings"] == MAX_POSITIONS
    catalog = runtime_catalog()
    for runtime in ("hf", "vllm-hf"):
        assert declared in catalog.get(runtime).checkpoints


def test_the_qwen3_build_is_not_changed_by_them(tmp_path: Path) -> None:
    from pytest_logprob_drift.runtimes.tiny_model import SPECIAL_TOKENS, build_tiny_checkpoint

    build_tiny_checkpoint(tmp_path)
    tokenizer = json.loads((tmp_path / "tokenizer.json").read_text())
    assert [t["content"] for t in tokenizer["added_tokens"]] == list(SPECIAL_TOKENS)
    assert "chat_template" not in json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [
        "Qwen3ForCausalLM"
    ]


@pytest.mark.parametrize("arch", TINY_MOE_ARCHITECTURES, ids=lambda a: a.name)
def test_each_moe_build_is_deterministic_declared_and_reads_back_its_experts(
    arch: TinyArchitecture, tmp_path: Path
) -> None:
    import torch
    import transformers

    from pytest_logprob_drift.runtimes import TINY_MOE_ARCHITECTURES as DECLARED_MOE
    from pytest_logprob_drift.runtimes.transformers import moe

    first, second = tmp_path / "a", tmp_path / "b"
    build_tiny_architecture(arch, first)
    build_tiny_architecture(arch, second)
    assert checkpoint_digest(first) == checkpoint_digest(second)
    assert (first / "model.safetensors").read_bytes() == (second / "model.safetensors").read_bytes()
    config = json.loads((first / "config.json").read_text())
    assert config["architectures"] == [arch.model_class]
    assert (config["hidden_size"], config["head_dim"], config["vocab_size"]) == (128, 64, 1024)
    loaded = transformers.AutoConfig.from_pretrained(first)  # num_experts: an attribute alias
    assert (loaded.num_experts, loaded.num_experts_per_tok) == (4, 2)
    for key, value in arch.config.items():
        assert getattr(loaded, key) == value, key
    expert_rows = config.get("moe_intermediate_size", config["intermediate_size"])
    assert expert_rows % 64 == 0  # a multiple of 32 per rank at TP 1 and 2
    declared = {c.uri: c for c in DECLARED_MOE}[TINY_SCHEME + arch.name]
    assert declared.model_type == config["model_type"]
    for runtime in ("hf", "vllm-hf"):
        assert declared in runtime_catalog().get(runtime).checkpoints
    model = transformers.AutoModelForCausalLM.from_pretrained(first, dtype=torch.bfloat16)
    assert len(moe.moe_routers(model)) == config["num_hidden_layers"] == 2
    assert moe.experts_implementation(model) == model.config._experts_implementation
    assert moe.experts_implementation(model) is not None
    dense = transformers.AutoModelForCausalLM.from_pretrained(
        resolve_checkpoint(TINY_SCHEME + TINY_ARCHITECTURES[0].name, expected_digest=None).path
    )
    assert moe.experts_implementation(dense) is None
