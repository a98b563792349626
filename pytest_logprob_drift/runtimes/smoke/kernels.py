"""Kernels of the smoke-only selected-logprob backends (torch).

Owns ``smoke_only.logp_reference`` (PyTorch log_softmax plus gather, in float32),
``smoke_only.logp_offset`` (the same, plus an authorized deterministic offset on the training
side that exceeds the contract threshold, to prove mismatch detection),
``smoke_only.logp_rollout_offset`` (the same offset on the rollout side only, to prove that a
backend injected into a rollout engine produced the rollout's logprobs) and
``smoke_only.rollout_weight_perturbation`` (the reference formula; built inside a vLLM worker
on the last tensor-parallel rank, it adds 1 to element [0, 0] of that rank's
``model.embed_tokens.weight`` shard, to prove that the weight check names the tensor, the side
and the rank). Knows nothing about
registration or authorization: that is the descriptors' and the session's job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from pytest_logprob_drift.config.contract import resolve_contract
from pytest_logprob_drift.records import JsonValue
from pytest_logprob_drift.runtimes.smoke.operators import OFFSET_MULTIPLE_OF_THRESHOLD


def reference_selected_logprob(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    if logits.shape[:-1] != token_ids.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and token_ids {tuple(token_ids.shape)} do not align"
        )
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return logprobs.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)


def build_offset_selected_logprob(
    *, target: str, options: Mapping[str, JsonValue]
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Reference on the rollout side; reference minus a fixed offset on the training side."""
    if options:
        raise ValueError(f"smoke_only.logp_offset takes no options, got {sorted(options)}")
    threshold = resolve_contract("ws1", "current").threshold
    offset = OFFSET_MULTIPLE_OF_THRESHOLD * threshold if target == "training" else 0.0

    def offset_selected_logprob(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        return reference_selected_logprob(logits, token_ids) - offset

    return offset_selected_logprob


def build_rollout_offset_selected_logprob(
    *, target: str, options: Mapping[str, JsonValue]
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Reference minus a fixed offset (8x the ws1 threshold, in float32) on the rollout side;
    reference on the training side."""
    if options:
        raise ValueError(f"smoke_only.logp_rollout_offset takes no options, got {sorted(options)}")
    threshold = resolve_contract("ws1", "current").threshold
    offset = OFFSET_MULTIPLE_OF_THRESHOLD * threshold if target == "rollout" else 0.0

    def rollout_offset_selected_logprob(
        logits: torch.Tensor, token_ids: torch.Tensor
    ) -> torch.Tensor:
        return reference_selected_logprob(logits, token_ids) - offset

    return rollout_offset_selected_logprob


def build_rollout_weight_perturbation(
    *, target: str, options: Mapping[str, JsonValue]
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The reference formula on both sides; on the rollout side, inside a vLLM worker whose
    model the worker extension saw loaded, on the last TP rank: element [0, 0] of that rank's
    ``model.embed_tokens.weight`` shard plus 1, in place (elsewhere, e.g. when the catalog
    builds it in the frontend's process, nothing is changed)."""
    if options:
        raise ValueError(
            f"smoke_only.rollout_weight_perturbation takes no options, got {sorted(options)}"
        )
    if target == "rollout":
        _perturb_last_rank_embedding()
    return reference_selected_logprob


def _perturb_last_rank_embedding() -> None:
    import sys

    worker_ext = sys.modules.get("pytest_logprob_drift.runtimes.vllm.worker_ext")
    model = worker_ext.loaded_model() if worker_ext is not None else None
    if model is None:
        return
    from vllm.distributed.parallel_state import get_tp_group

    group = get_tp_group()
    if int(group.rank_in_group) != int(group.world_size) - 1:
        return
    with torch.no_grad():
        model.model.embed_tokens.weight[0, 0] += 1.0
