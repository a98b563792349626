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
