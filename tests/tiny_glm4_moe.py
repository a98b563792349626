"""A tiny GLM4-MoE built with transformers alone, seeded, for the tests of its float32 router
bias (``mlp.gate.e_score_correction_bias``): no catalog build, nothing downloaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

SEED = 59
"""The seed every tiny GLM4-MoE of the tests is built from."""


def tiny_glm4_moe(*, vocab_size: int, bias_scale: float | None = None, **config: Any) -> Any:
    """A seeded two-layer ``Glm4MoeForCausalLM`` in float32 (4 routed experts, 2 per token, one
    shared), vocabulary ``vocab_size``, other config members ``config`` (e.g. a smaller hidden
    size, the token ids); with ``bias_scale``, each layer's router bias drawn N(0, bias_scale)
    (a trained-looking value; None: its initial zeros)."""
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    members: dict[str, Any] = {
        "hidden_size": 128,
        "intermediate_size": 256,
        "moe_intermediate_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "max_position_embeddings": 128,
        "tie_word_embeddings": False,
        **config,
    }
    built_config = Glm4MoeConfig(
        vocab_size=vocab_size,
        num_hidden_layers=2,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=0,
        **members,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        built = Glm4MoeForCausalLM(built_config).to(torch.float32)
        if bias_scale is not None:
            with torch.no_grad():
                for layer in built.model.layers:
                    bias = layer.mlp.gate.e_score_correction_bias
                    bias.copy_(torch.randn(bias.shape) * bias_scale)
    return built


def save_tiny_glm4_moe(target: Path, **build: Any) -> Path:
    """``tiny_glm4_moe(**build)`` saved with ``save_pretrained`` under ``target``."""
    tiny_glm4_moe(**build).save_pretrained(target)
    return target
