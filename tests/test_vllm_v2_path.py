"""vLLM's CUDA path, checked on CPU where it runs: its config validation and the V2 wiring.

No vLLM CUDA engine runs here. What does run on CPU is checked against vLLM itself:

- its own config validation for context parallelism (``EngineArgs.create_engine_config``,
  ``PCPManager.validate_config``, ``ModelConfig.verify_with_parallel_config``) says what the
  ``vllm-hf`` rule restates (the rule's quotes are vLLM's messages);
- its resolution of ``enforce_eager`` into compilation and CUDA-graph modes, which the
  read-back turns back into the knob (``read_back.eager_of``);
- the model runner V2 functions the ``logp.backend`` injection replaces exist and are the ones
  the V2 sampler and prompt-logprobs path call (by import, attribute and code names), and the
  wrappers do what they say on real tensors against an independent float64 log-softmax (the
  Triton kernels they wrap run only on CUDA: a stand-in with their contract is wrapped here);
- the logits probe works on a plain (non-Module) sampler as V2's is.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import skip_unless_installed

from pytest_logprob_drift.runtimes import VLLM_HF
from pytest_logprob_drift.runtimes.vllm import rollout_logp, rollout_logp_v2
from pytest_logprob_drift.runtimes.vllm.read_back import (
    context_parallel_of,
    eager_of,
)

skip_unless_installed("vllm")
pytestmark = pytest.mark.slow  # vLLM's own modules: imports vLLM


@pytest.fixture(scope="module")
def tiny() -> Path:
    from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint

    return resolve_checkpoint("tiny://qwen3-h64-v1", expected_digest=None).path


def _engine_config(model: Path, **kwargs: Any) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(model), skip_tokenizer_init=True, **kwargs).create_engine_config()


# ------------------------------------------------------------------ context parallelism


def test_vllm_refuses_prefill_cp_on_v1_as_the_rule_says(tiny: Path) -> None:
    rule = VLLM_HF.context_parallel
    assert rule is not None and rule.needs_mla and rule.devices == ("cuda",)
    with pytest.raises(ValueError, match="Model Runner V1 does not support: prefill context") as e:
        _engine_config(tiny, prefill_context_parallel_size=2)
    assert "Model Runner V1 does not support: prefill context parallel" in str(e.value)
    assert "'Model Runner V1 does not support: prefill context parallel'" in rule.rule


def test_vllm_refuses_prefill_cp_for_a_non_mla_model_as_the_rule_says(tiny: Path) -> None:
    from vllm.v1.worker.gpu.pcp_manager import PCPManager

    config = _engine_config(tiny)
    assert config.model_config.use_mla is False
    probe = copy.copy(config)
    parallel = copy.copy(config.parallel_config)
    object.__setattr__(parallel, "prefill_context_parallel_size", 2)
    object.__setattr__(probe, "parallel_config", parallel)
    with pytest.raises(NotImplementedError) as refused:
        PCPManager.validate_config(probe, False)
    message = str(refused.value)
    assert message == "MRV2 PCP currently supports MLA models only."
    rule = VLLM_HF.context_parallel
    assert rule is not None and f"'{message.rstrip('.')}'" in rule.rule
    PCPManager.validate_config(config, False)  # size 1: nothing to refuse


def test_decode_cp_is_another_setting_vllm_bounds_by_kv_heads(tiny: Path, tmp_path: Path) -> None:
    from vllm.config import ModelConfig, ParallelConfig

    model = tmp_path / "gqa"
    shutil.copytree(tiny, model)
    config = json.loads((model / "config.json").read_text())
    config.update(num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    (model / "config.json").write_text(json.dumps(config))
    model_config = ModelConfig(model=str(model), skip_tokenizer_init=True)
    with pytest.raises(
        ValueError, match=r"greater than the model's total number of KV heads \(2\)"
    ):
        model_config.verify_with_parallel_config(
            ParallelConfig(tensor_parallel_size=2, decode_context_parallel_size=2)
        )
    rule = VLLM_HF.context_parallel
    assert rule is not None and "needs TP > KV heads" in rule.not_substituted
    # what the knob reads back as: the prefill size, never a decode size
    assert context_parallel_of(4, 1) == 4
    assert context_parallel_of(1, 2) == (
        "mismatch: decode_context_parallel_size=2 (prefill_context_parallel_size=1); this "
        "knob is the prefill size"
    )


# ------------------------------------------------------------------ eager vs compiled


def test_enforce_eager_reads_back_from_what_vllm_resolved(tiny: Path) -> None:
    for eager in (True, False):
        config = _engine_config(tiny, enforce_eager=eager)
        compilation = config.compilation_config
        assert (
            eager_of(
                enforce_eager=bool(config.model_config.enforce_eager),
                compilation_mode=compilation.mode.name,
                cudagraph_mode=compilation.cudagraph_mode.name,
            )
            is eager
        )
    assert eager_of(enforce_eager=False, compilation_mode="NONE", cudagraph_mode="NONE") == (
        "mismatch: enforce_eager=False but compilation mode NONE, cudagraph_mode NONE"
    )
    assert eager_of(
        enforce_eager=True, compilation_mode="NONE", cudagraph_mode="FULL_AND_PIECEWISE"
    ).startswith("mismatch: enforce_eager=True")
    assert (
        eager_of(
            enforce_eager=False,
            compilation_mode="VLLM_COMPILE",
            cudagraph_mode="FULL_AND_PIECEWISE",
        )
        is False
    )


def test_the_cpu_build_runs_model_runner_v1(tiny: Path) -> None:
    # the CPU platform falls back to V1 (no Triton), so everything V2 is for CUDA only
    assert _engine_config(tiny).use_v2_model_runner is False


# ------------------------------------------------------------------ V2 injection targets


def test_the_v2_targets_are_what_the_sampler_and_prompt_path_call() -> None:
    from vllm.v1.worker.gpu.sample import logprob, prompt_logprob, sampler

    modules = rollout_logp_v2.targets()
    assert modules == {"logprob": logprob, "sampler": sampler, "prompt_logprob": prompt_logprob}
    # independently of ``targets``: vLLM's own wiring, by attribute and by code names
    assert sampler.compute_topk_scores is logprob.compute_topk_scores
    assert prompt_logprob.compute_topk_scores is logprob.compute_topk_scores
    assert prompt_logprob.compute_token_logprobs is logprob.compute_token_logprobs
    assert "compute_topk_scores" in sampler.Sampler.__call__.__code__.co_names
    assert "compute_token_logprobs" in logprob.compute_topk_scores.__code__.co_names
    chunking = prompt_logprob.compute_prompt_logprobs_with_chunking
    assert "compute_topk_scores" in chunking.__code__.co_names
    assert rollout_logp_v2.untouched()


def test_install_replaces_exactly_the_v2_sites(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.worker.gpu.sample import logprob, prompt_logprob, sampler

    for module, name in (
        (logprob, "compute_token_logprobs"),
        (sampler, "compute_topk_scores"),
        (prompt_logprob, "compute_topk_scores"),
        (prompt_logprob, "compute_token_logprobs"),
    ):
        monkeypatch.setattr(module, name, getattr(module, name))  # restored afterwards
    monkeypatch.setattr(rollout_logp_v2, "_STATE", {})
    original = logprob.compute_token_logprobs
    spec = {"backend": "b", "version": "1"}
    sites = rollout_logp_v2.install(spec, _kernel, "raw_logprobs", rollout_logp._score)
    assert sites == list(rollout_logp_v2.SITES)
    assert logprob.compute_token_logprobs.__wrapped__ is original
    assert not rollout_logp_v2.untouched()
    assert rollout_logp_v2.targets()["logprob"] is logprob  # still vLLM's wiring underneath
    assert rollout_logp_v2.install(spec, _kernel, "raw_logprobs", rollout_logp._score) == sites
    with pytest.raises(ValueError, match="already runs backend 'b'"):
        rollout_logp_v2.install({"backend": "c"}, _kernel, "raw_logprobs", rollout_logp._score)


def test_restore_puts_vllms_own_functions_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new engine built in this process (its engine core run here) starts with vLLM's
    logprobs: ``restore`` undoes ``install`` at every site and forgets the backend."""
    from vllm.v1.worker.gpu.sample import logprob, prompt_logprob, sampler

    own = {
        (module, name): getattr(module, name)
        for module, name in (
            (logprob, "compute_token_logprobs"),
            (sampler, "compute_topk_scores"),
            (prompt_logprob, "compute_topk_scores"),
            (prompt_logprob, "compute_token_logprobs"),
        )
    }
    for (module, name), function in own.items():
        monkeypatch.setattr(module, name, function)  # restored afterwards
    monkeypatch.setattr(rollout_logp_v2, "_STATE", {})
    rollout_logp_v2.restore()  # nothing installed: nothing changes
    assert all(getattr(m, n) is f for (m, n), f in own.items())
    rollout_logp_v2.install({"backend": "b"}, _kernel, "raw_logprobs", rollout_logp._score)
    assert not any(getattr(m, n) is f for (m, n), f in own.items())
    rollout_logp_v2.restore()
    assert all(getattr(m, n) is f for (m, n), f in own.items())
    assert rollout_logp_v2.untouched() and rollout_logp_v2.state() is None
    # Another backend installs now without the "already runs backend" refusal.
    rollout_logp_v2.install({"backend": "c"}, _kernel, "raw_logprobs", rollout_logp._score)
    assert rollout_logp_v2.state() is not None


def _reference(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """The contract of vLLM's ``compute_token_logprobs``: float32 ``[B, K]`` log-softmax
    values at ``token_ids`` (float64 here, independently of any project code)."""
    full = torch.log_softmax(logits.double(), dim=-1)
    return full.gather(-1, token_ids.long()).float()


def _kernel(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """A backend whose value differs from the reference by exactly 0.5 (so its column shows)."""
    return (_reference(logits, token_ids.unsqueeze(-1))[:, 0].double() + 0.5).float()


def _topk_contract(
    logits: torch.Tensor,
    num_logprobs: int,
    sampled_token_ids: torch.Tensor,
    cu_num_logits: Any = None,
    logprob_token_ids_state: Any = None,
    expanded_idx_mapping: Any = None,
    max_per_req_token_ids: int = 0,
    logits_mode: bool = False,
) -> torch.Tensor:
    """``compute_topk_scores``'s signature and flow, calling the wrapped
    ``compute_token_logprobs`` (a gather in a ``*_logits`` mode, as vLLM)."""
    ids = sampled_token_ids.unsqueeze(-1)
    if num_logprobs > 0:
        ids = torch.cat((ids, torch.topk(logits, num_logprobs, dim=-1).indices), dim=1)
    if logits_mode:
        return logits.gather(-1, ids).float()
    return _CALLS["token"](logits, ids)  # type: ignore[no-any-return]


_CALLS: dict[str, Any] = {}


def test_the_wrappers_replace_the_target_column_only_inside_a_site() -> None:
    state = rollout_logp_v2._State({"backend": "b"}, _kernel, "raw_logprobs")
    token = rollout_logp_v2.token_logprobs_wrapper(_reference, state, rollout_logp._score)
    _CALLS["token"] = token
    sampled = rollout_logp_v2.topk_scores_wrapper(_topk_contract, state, "sampled_rows")
    prompt = rollout_logp_v2.topk_scores_wrapper(_topk_contract, state, "prompt_rows")
    logits = torch.randn(5, 33, generator=torch.Generator().manual_seed(3))
    ids = torch.tensor([1, 7, 0, 32, 5])
    out = sampled(logits, 2, ids)
    reference = _reference(logits, torch.cat((ids.unsqueeze(-1), logits.topk(2).indices), 1))
    assert torch.equal(out[:, 1:], reference[:, 1:])  # vLLM's own top-k columns kept
    assert torch.allclose(out[:, 0].double(), reference[:, 0].double() + 0.5, atol=1e-6)
    assert state.counts["sampled_rows"] == 5
    prompt(logits[:3], 0, ids[:3])
    assert state.counts["prompt_rows"] == 3
    # outside any site (speculative decoding's rejection sampler): vLLM's value, counted
    plain = token(logits, ids.unsqueeze(-1))
    assert torch.equal(plain, _reference(logits, ids.unsqueeze(-1)))
    assert state.counts["unsupported_request"] == 1
    # custom logprob_token_ids and *_logits modes are left to vLLM, counted once each
    custom = sampled(logits, 0, ids, max_per_req_token_ids=3)
    assert torch.equal(custom, _reference(logits, ids.unsqueeze(-1)))
    assert state.counts["unsupported_request"] == 2
    sampled(logits, 0, ids, None, None, None, 0, True)
    assert state.counts["unsupported_mode"] == 1
    assert state.counts["unsupported_request"] == 2
    assert state.counts["sampled_rows"] == 5  # the refused calls scored nothing
    counted = rollout_logp_v2.counted_wrapper(_reference, state)
    assert torch.equal(counted(logits, ids.unsqueeze(-1)), _reference(logits, ids.unsqueeze(-1)))
    assert state.counts["unsupported_request"] == 3


def test_a_failing_kernel_is_counted_and_never_hidden() -> None:
    def broken(_logits: torch.Tensor, _ids: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("no")

    state = rollout_logp_v2._State({"backend": "b"}, broken, "raw_logprobs")
    token = rollout_logp_v2.token_logprobs_wrapper(_reference, state, rollout_logp._score)
    _CALLS["token"] = token
    sampled = rollout_logp_v2.topk_scores_wrapper(_topk_contract, state, "sampled_rows")
    out = sampled(torch.randn(2, 9), 0, torch.tensor([0, 1]))
    assert torch.isnan(out[:, 0]).all()
    assert state.counts["kernel_error"] == 1


def test_the_logits_probe_works_on_a_plain_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    class PlainSampler:  # V2's Sampler is no torch Module: called as sampler(logits, batch)
        logprobs_mode = "raw_logprobs"

        def __call__(self, logits: torch.Tensor, batch: object) -> str:
            return f"sampled {tuple(logits.shape)}"

    monkeypatch.setattr(rollout_logp, "_LOGITS_SEEN", rollout_logp._LogitsSeen())
    sampler = PlainSampler()
    rollout_logp.observe_logits(sampler)
    rollout_logp.observe_logits(sampler)  # once
    assert sampler(torch.zeros(3, 17, dtype=torch.bfloat16), None) == "sampled (3, 17)"
    assert rollout_logp.logits_seen() == {
        "sampler_logits_dtypes": ["bfloat16"],
        "sampler_logits_width": 17,
    }
    assert rollout_logp._LOGITS_SEEN.dtypes["bfloat16"] == 1
