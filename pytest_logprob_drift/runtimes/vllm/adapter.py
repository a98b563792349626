"""The ``vllm-hf`` runtime: a real vLLM rollout engine against transformers training.

Owns the adapter that maps rollout knobs onto a ``VllmEngineSpec`` (dtype, tensor parallel
size with the CPU thread binding, prefix caching, eager vs compiled/graph path, logprobs mode,
LM head dtype) and maps the values the engine reads back (``VllmRolloutEngine.read_back`` and
``context_parallel_size``) onto knob paths as ``actual``; ``batch.size`` chunks the requests
submitted together. ``logp.backend``: a catalog backend is installed in every worker's sampler
before the engine's first request (``rollout_logp``, through the worker extension) and its
``actual`` is what the workers read back for the call (``logp_check.injection_actual``);
``native`` must read back vLLM's own sampler. ``rollout.lm_head_dtype=float32`` builds the
engine with ``hf_overrides={"head_dtype": "float32"}`` and is read back from the dtype of the
logits the workers' samplers receive (``logp_check.lm_head_actual``). Context parallelism is
mapped to vLLM's ``prefill_context_parallel_size`` on CUDA (for an MLA checkpoint, which
``plan.context_parallel`` checks before any engine starts) and recorded as unsupported on
vLLM's CPU platform; it is read back from the engine's parallel config, and a decode context
parallel size other than 1 reads back as a mismatch, never as this knob. The sampling
truncation (top_p, top_k, min_p) reported for identity validation is what the requests of the
call ran with in the workers (``read_back.sampling_applied``). ``rollout.enforce_eager`` reads
back from the compilation and CUDA-graph modes vLLM resolved (``read_back.eager_of``). Decode
replay runs through vLLM's trace replay where the engine has it (model runner V2).
``rollout.weight_sync``: ``checkpoint`` loads from disk; ``trainer`` and ``trainer_refit``
build the engine with dummy weights and receive the training side's before the first
request (``VllmRollout.receive_weights``; ``runtimes.weight_push``), a planted (test-only)
variant resolved once per case (``execute.side_settings.WeightSync``); the read-back says how
the weights arrived. The training side is the ``hf`` runtime's read-only scorer (unsharded or
FSDP2).

Knows nothing about vLLM's config objects, workers or processes (``engine``, ``read_back`` and
``processes`` read those; the adapter imports vLLM only for its version and when an engine is
built), nor about comparison, verdicts or artifacts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pytest_logprob_drift.errors import UsageError
from pytest_logprob_drift.execute.protocol import (
    BoundKernel,
    LayersUnavailable,
    LogpKernel,
    Materialized,
    ReplayOutput,
    ReplayUnavailable,
    RolloutOutput,
    RoutingUnavailable,
    RuntimeBinding,
    TensorBatch,
    WeightSource,
    applied_sampling,
    backend_of,
)
from pytest_logprob_drift.execute.side_settings import SyncPush, WeightSync
from pytest_logprob_drift.plan.binding import EXPERT_PARALLEL_ON_CPU
from pytest_logprob_drift.records import JSONScalar, KnobValue, ScoringIdentity
from pytest_logprob_drift.runtimes.batch import active_rows, replay_grid, sequences
from pytest_logprob_drift.runtimes.materialization import (
    Evidence,
    always,
    applied,
    per_value,
    unsupported,
)
from pytest_logprob_drift.runtimes.tiny_model import ResolvedCheckpoint, special_token_ids
from pytest_logprob_drift.runtimes.transformers.adapter import (
    TransformersTrainingAdapter,
    side_identity,
)
from pytest_logprob_drift.runtimes.vllm.logp_check import (
    PROMPT,
    SAMPLED,
    injection_actual,
    lm_head_actual,
)
from pytest_logprob_drift.runtimes.vllm.logs import prepare_vllm_logging
from pytest_logprob_drift.runtimes.vllm.platform import rollout_sampler
from pytest_logprob_drift.runtimes.vllm.read_back import eager_of, sampling_applied
from pytest_logprob_drift.store.documents import WeightsDocument
from pytest_logprob_drift.store.read_back import ReadBackValue, read_back_part

if TYPE_CHECKING:
    import torch

    from pytest_logprob_drift.registry.session import KernelReference
    from pytest_logprob_drift.runtimes.vllm.engine import VllmEngineSpec, VllmRolloutEngine

MODEL_LEN_QUANTUM = 64
IN_PROCESS_ENGINE = "logprob_drift_vllm_engine_in_process"
"""A resource this process offers once: the vLLM engine it may build and drive at a time."""


def _model_len(identity: ScoringIdentity) -> int:
    longest = max(len(p) for p in identity.prompts.token_ids)
    need = longest + identity.sampling.max_new_tokens
    return max(MODEL_LEN_QUANTUM, -(-need // MODEL_LEN_QUANTUM) * MODEL_LEN_QUANTUM)


UNOBSERVED_SAMPLING = "unobservable: the workers' sampling probe saw no request of this call"
"""What the side reports for each truncation field when no worker's probe saw the call's
requests (a model runner the probe does not reach): a value that matches no identity, so the
case is INVALID_IDENTITY with this reason, never judged on the frontend's values."""


def _observed_truncation(
    observed: Mapping[str, Any], frontend: Mapping[str, float | int | None]
) -> dict[str, JSONScalar]:
    """The truncation the side reports for identity validation: what the workers' batches
    really took in (``read_back.sampling_applied``; several distinct values read as a
    ``mixed: ...`` string, which matches no identity). When the probe saw no request the
    values are unobservable (``UNOBSERVED_SAMPLING``, naming what the frontend sent), not
    the frontend's ``SamplingParams``: those are what was asked, not what ran."""
    values = list(observed.get("values") or [])
    if not observed.get("observed") or not values:
        sent = json.dumps(dict(frontend), sort_keys=True)
        text = f"{UNOBSERVED_SAMPLING} (the frontend sent {sent})"
        return {"sampling_top_p": text, "sampling_top_k": text, "sampling_min_p": text}
    if len(values) > 1:
        mixed = f"mixed: {json.dumps(values, sort_keys=True)}"
        return {"sampling_top_p": mixed, "sampling_top_k": mixed, "sampling_min_p": mixed}
    (v,) = values
    return applied_sampling(
        top_p=float(v["top_p"]) if float(v["top_p"]) < 1.0 else None,
        top_k=int(v["top_k"]) if int(v["top_k"]) > 0 else None,
        min_p=float(v["min_p"]) if float(v["min_p"]) > 0.0 else None,
    )


def _reference(logp: LogpKernel | None) -> KernelReference | None:
    """What a vLLM worker needs to build the case's rollout kernel (None for native, or for a
    kernel with no importable factory, which ``injection_actual`` then reports as not
    injected)."""
    return logp.reference if isinstance(logp, BoundKernel) else None


def _injection(live: Mapping[str, Any]) -> list[dict[str, Any]]:
    reports = live.get("logp_injection")
    return [dict(r) for r in reports] if isinstance(reports, list) else []


def _logp_ran(
    logp: LogpKernel | None,
    reference: KernelReference | None,
    earlier: Mapping[str, Any],
    live: Mapping[str, Any],
    *,
    rows: int,
    site: str,
) -> tuple[str, str]:
    """Which selected-logprob backend the workers ran on ``rows`` rows at ``site`` between
    two read-backs (``earlier``, ``live``), and the evidence (``logp_check.injection_actual``)."""
    return injection_actual(
        asked=backend_of(logp),
        reference=reference,
        before=_injection(earlier),
        after=_injection(live),
        rows=rows,
        site=site,
        tp_size=int(str(live["tensor_parallel_size"])),
    )


def vllm_platform_is_cpu() -> bool:
    """Whether the installed vLLM build runs on its CPU platform (imports vLLM once)."""
    prepare_vllm_logging()
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


_PUSH = (
    "vllm.LLM(load_format='dummy'); then the training side's parameters and persistent "
    "buffers (gathered whole, FSDP2 with full_tensor()), cast to rollout.dtype, in chunks "
    "that keep tied tensors together, are loaded in place in every worker through the "
    "worker extension (collective_rpc: vLLM's layerwise reload, "
    "initialize_layerwise_reload / model.load_weights / finalize_layerwise_reload, "
    "which re-runs process_weights_after_loading), then LLM.reset_prefix_cache()"
)
_SYNC_EVIDENCE = {
    SyncPush.CHECKPOINT: "vllm.LLM(model=...) loads the checkpoint's safetensors from disk",
    SyncPush.TRAINER: _PUSH,
    SyncPush.TRAINER_REFIT: "the engine first receives a seeded previous policy the same way "
    f"and serves the case's prompts; then: {_PUSH}",
}


def _weight_sync(_path: str, value: KnobValue) -> Materialized:
    sync = WeightSync.from_knob(value)
    if sync.planted is not None:
        return applied(value, f"test-only planted sync bug: {sync.planted.description}")
    return applied(value, _SYNC_EVIDENCE[sync.push])


def _tensor_parallel(_path: str, value: KnobValue) -> Materialized:
    if vllm_platform_is_cpu():
        return applied(
            value,
            "vllm.LLM(tensor_parallel_size=...); CPU threads bound per rank by "
            "VLLM_CPU_OMP_THREADS_BIND",
        )
    return applied(value, "vllm.LLM(tensor_parallel_size=...); one GPU per rank")


def _context_parallel(path: str, value: KnobValue) -> Materialized:
    if value == 1:
        return applied(value, "no context parallelism")
    if vllm_platform_is_cpu():
        return unsupported(path, value, "the vLLM CPU platform has no context parallelism")
    return applied(
        value,
        "vllm.LLM(prefill_context_parallel_size=...): prefill split over that many more GPUs "
        "(TP x CP in all); vLLM 0.32 runs it only for an MLA checkpoint on model runner V2, "
        "which planning and the runner check from the checkpoint's config.json before any "
        "engine starts and vLLM's PCPManager checks again; read back from the engine's "
        "parallel config, with decode_context_parallel_size required to be 1",
    )


def _expert_parallel(path: str, value: KnobValue) -> Materialized:
    if value is False:
        return applied(value, "no expert parallelism: every expert sharded over the TP ranks")
    if vllm_platform_is_cpu():
        return unsupported(path, value, EXPERT_PARALLEL_ON_CPU)
    return unsupported(path, value, "vllm.LLM(enable_expert_parallel=...) is not wired yet")


def _logprobs_mode(_path: str, value: KnobValue) -> Materialized:
    return applied(
        value,
        f"vllm.LLM(logprobs_mode={value!r}); "
        + (
            "logprobs of the processed logits vLLM samples from (temperature, min_p, top_k, "
            "top_p, renormalized)"
            if value == "processed_logprobs"
            else "logprobs of the raw logits"
        ),
    )


def _logp_backend(_path: str, value: KnobValue) -> Materialized:
    if value == "native":
        return applied(
            value,
            "vLLM sampler logprobs (in its logprobs_mode) and the trainer's native log_softmax",
        )
    return applied(
        value,
        f"{value} on both sides: in every vLLM worker's sampler (worker extension; model runner "
        "V1: runtimes.vllm.rollout_logp, V2: runtimes.vllm.rollout_logp_v2, never run on a GPU "
        "here) the sampled token's logprob is kernel(logits, sampled ids), the logits being the "
        "raw LM head output in the model's dtype (raw_logprobs) or the float32 processed logits "
        "vLLM sampled from (processed_logprobs), and a prompt token's logprob is kernel(raw "
        "logits, prompt ids); read back from every worker's sampler; the trainer calls it on "
        "its logits",
    )


class VllmRollout:
    """One vLLM engine per rollout construction fingerprint."""

    def __init__(
        self,
        binding: RuntimeBinding,
        identity: ScoringIdentity,
        checkpoint: ResolvedCheckpoint,
        *,
        launcher: str = "local",
        ray_address: str | None = None,
    ) -> None:
        prepare_vllm_logging()
        from pytest_logprob_drift.runtimes.vllm.engine import VllmEngineSpec

        self.construction_fingerprint = binding.rollout_construction_fingerprint
        self.checkpoint = checkpoint
        settings = binding.rollout_settings
        self.weight_sync = settings.weight_sync
        self.weights_arrived: dict[str, Any] = {}
        """How the weights arrived (``receive_weights``); empty while none were pushed."""
        self.weights_in = self.weight_sync.from_checkpoint
        """Whether the engine holds the checkpoint's weights: loaded from disk, or pushed."""
        spec = VllmEngineSpec(
            model_dir=str(self.checkpoint.path),
            dtype=settings.dtype.value,
            tensor_parallel_size=settings.tensor_parallel_size,
            prefill_context_parallel_size=settings.context_parallel_size,
            enable_prefix_caching=settings.enable_prefix_caching,
            enforce_eager=settings.enforce_eager,
            seed=identity.sampling.seed,
            max_model_len=_model_len(identity),
            logprobs_mode=settings.logprobs_mode.value,
            lm_head_dtype=settings.lm_head_dtype.value,
            full_vocabulary=binding.full_vocabulary is not None,
            trace_replay=binding.replay,
            distributed_executor_backend="ray" if launcher == "ray" else None,
            ray_address=ray_address,
            device=str(binding.scorer["device"]),
            load_format="auto" if self.weight_sync.from_checkpoint else "dummy",
        )
        self.launcher = launcher
        self.full_vocabulary = spec.full_vocabulary
        from pytest_logprob_drift.runtimes.vllm.engine import PlatformMismatch

        try:
            self.engine = self.build_engine(spec)
        except PlatformMismatch as exc:
            raise UsageError(f"scenario.device: {exc}") from None
        self.lm_head_requested = spec.lm_head_dtype
        self.batch_size = 0
        self.backend_used = ""
        self.logp_evidence = ""
        self.sampling_observed: dict[str, Any] = {"observed": False, "values": []}
        self._layer_evidence: dict[str, JSONScalar] = {}
        self._routing_layers = 0
        self._special = special_token_ids(self.checkpoint.path)
        self._weights: WeightsDocument | None = None
        self._installed = False
        self._pushed_via: dict[str, str] = {}
        """Per pushed tensor, the trainer's dtype the engine holds it through
        (``weight_push.pushed_through``: a bfloat16 trainer tensor in a float32 parameter)."""

    @property
    def awaits_weights(self) -> bool:
        """Whether this engine was started without the checkpoint's weights and has not yet
        received the trainer's (``execute.protocol.WeightReceiver``)."""
        return not self.weights_in

    def receive_weights(self, source: WeightSource, identity: ScoringIdentity) -> None:
        """The trainer-to-rollout push, once per engine construction, before its first
        request. ``trainer``: the training side's state (``source.weight_state``), cast to
        the rollout dtype and chunked with every tie group in one chunk
        (``runtimes.weight_push``), is loaded into the live engine in place
        (``VllmRolloutEngine.push_weights``), then the prefix cache is reset. ``trainer_refit``:
        first the deterministic previous policy is pushed the same way, the case's prompts
        are served with the case's sampling and prefix-caching setting, and only then the
        trainer's state is pushed and the prefix cache reset. A planted variant
        (``planted:NAME``, test-only) gets one step wrong on purpose. What happened is kept
        in ``weights_arrived`` and read back."""
        import time

        from pytest_logprob_drift.runtimes import weight_push

        t0 = time.perf_counter()
        state = source.weight_state()
        gathered_s = time.perf_counter() - t0
        dtype = self.engine.spec.dtype
        planted = self.weight_sync.planted
        # The engine's own per-tensor declaration (what vLLM constructed each parameter in,
        # read by the workers before any weight was loaded): each tensor is pushed in it.
        held = dict(self.engine.loaded_weights.declared)
        self._pushed_via = weight_push.pushed_through(state, dtype, held)
        arrived: dict[str, Any] = {
            "weight_sync": self.weight_sync.knob_value,
            "source_dtypes": sorted({str(t.dtype).removeprefix("torch.") for t in state.values()}),
            "rollout_dtype": dtype,
            "pushed_in_engine_dtypes": {
                n: str(d).removeprefix("torch.")
                for n, d in weight_push.push_dtypes(state, dtype, held).items()
                if n in held
            },
            "gather_s": gathered_s,
            "source_evidence": dict(getattr(source, "weight_gather", {}) or {}),
        }
        if self.weight_sync.push is SyncPush.TRAINER_REFIT:
            before = weight_push.previous_policy(state)
            first = list(weight_push.chunks(before, dtype, held=held))
            previous = self.engine.push_weights([c.payload for c in first])
            previous["loaded_by_vllm"] = [len(n) for n in previous.pop("loaded_per_worker")]
            previous.pop("not_loaded_per_worker")
            arrived["previous_policy"] = {
                **previous,
                "seed": weight_push.PREVIOUS_POLICY_SEED,
                "scale": weight_push.PREVIOUS_POLICY_SCALE,
            }
            eos, pad = self._special
            sampling = identity.sampling
            self.engine.generate(
                identity.prompts.token_ids,
                max_new_tokens=sampling.max_new_tokens,
                temperature=sampling.temperature,
                seed=sampling.seed,
                batch_size=len(identity.prompts.token_ids),
                eos_token_id=eos,
                pad_token_id=pad,
                mask_policy=identity.mask_policy,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                min_p=sampling.min_p,
            )
            arrived["previous_policy"]["served_prompts"] = len(identity.prompts.token_ids)
            arrived["previous_policy"]["generated_tokens"] = self.engine.generated_tokens
        pushed_state, skipped = weight_push.planted_state(state, planted)
        pushed = list(weight_push.chunks(pushed_state, dtype, skip=skipped, held=held))
        keep_cache = planted is not None and planted.keep_prefix_cache
        report = self.engine.push_weights(
            [c.payload for c in pushed], reset_prefix_cache=not keep_cache
        )
        loaded = report.pop("loaded_per_worker")
        report["not_loaded_by_vllm"] = sorted(
            {n for names in report.pop("not_loaded_per_worker") for n in names}
        )
        arrived.update(
            {
                **report,
                "tensor_bytes": weight_push.total_bytes(pushed),
                "tensors": len(weight_push.names_of(pushed)),
                "left_out": list(skipped),
                "loaded_by_vllm": [len(names) for names in loaded],
                "tie_groups": [g for g in weight_push.tie_groups(state) if len(g) > 1],
            }
        )
        if planted is not None:
            arrived["planted"] = planted.description
        self.weights_arrived = arrived
        self.weights_in = True

    def build_engine(self, spec: VllmEngineSpec) -> VllmRolloutEngine:
        """The engine this rollout samples with (a new one, built from ``spec``)."""
        from pytest_logprob_drift.runtimes.vllm.engine import VllmRolloutEngine

        return VllmRolloutEngine(spec)

    def generate(
        self, identity: ScoringIdentity, *, batch_size: int, logp: LogpKernel | None
    ) -> RolloutOutput:
        self.batch_size = batch_size
        reference = _reference(logp)
        if reference is not None:
            # Before the engine's first request of the case; the engine serves one rollout
            # operator binding (its construction fingerprint), so this installs once.
            self.engine.install_logp(reference)
            self._installed = True
        eos, pad = self._special
        sampling = identity.sampling
        steps: list[list[torch.Tensor]] | None = [] if self.full_vocabulary else None
        earlier = self.engine.read_back()
        seen_before = earlier.get("sampling_seen")
        before = list(seen_before) if isinstance(seen_before, list) else []
        tensors = self.engine.generate(
            identity.prompts.token_ids,
            max_new_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            seed=sampling.seed,
            batch_size=batch_size,
            eos_token_id=eos,
            pad_token_id=pad,
            mask_policy=identity.mask_policy,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            min_p=sampling.min_p,
            steps=steps,
        )
        live = self.engine.read_back()
        seen = live.get("sampling_seen")
        self.sampling_observed = sampling_applied(
            before, list(seen) if isinstance(seen, list) else []
        )
        self.backend_used, self.logp_evidence = _logp_ran(
            logp, reference, earlier, live, rows=self.engine.generated_tokens, site=SAMPLED
        )
        truncation = _observed_truncation(self.sampling_observed, self.engine.applied_sampling)
        return RolloutOutput(
            tensors=tensors,
            identity={**side_identity(identity, self.checkpoint), **truncation},
            full_vocab=None if steps is None else active_rows(steps, tensors["active_mask"]),
            sampler=rollout_sampler(str(live["platform"]), str(live["model_runner"])),
        )

    def replay_prefill(
        self,
        identity: ScoringIdentity,
        rollout: TensorBatch,
        *,
        batch_size: int,
        logp: LogpKernel | None,
    ) -> ReplayOutput:
        """The sampled sequences scored again by this engine as prompts (``prompt_logprobs``,
        raw logprobs), in the case's own chunks of ``batch_size`` (``execute.protocol.
        PrefillReplay``)."""
        _eos, pad = self._special
        reference = _reference(logp)
        if reference is not None:
            self.engine.install_logp(reference)
        earlier = self.engine.read_back()
        values, scored, evidence = self.engine.replay_prefill(
            sequences(rollout), batch_size=batch_size
        )
        live = self.engine.read_back()
        asked = backend_of(logp)
        ran, how = _logp_ran(
            logp, reference, earlier, live, rows=int(evidence["prompt_tokens_scored"]), site=PROMPT
        )
        if ran != asked:
            raise ReplayUnavailable(f"the prompt logprobs of the replay did not run {asked}: {ran}")
        logprobs, token_ids = replay_grid(rollout, values, scored, pad)
        return ReplayOutput(
            logprobs=logprobs,
            token_ids=token_ids,
            evidence={
                "path": "vllm prompt_logprobs=0, max_tokens=1",
                "logprob_semantics": "raw",
                "batch_size": batch_size,
                "logp_backend": asked,
                "logp_evidence": how,
                **evidence,
            },
        )

    def capture_layers(
        self, identity: ScoringIdentity, rollout: TensorBatch, *, batch_size: int
    ) -> Mapping[str, torch.Tensor]:
        """The rollout side's layer capture on vLLM's prefill path, one sequence per request
        (``engine.capture_layers``; ``execute.protocol.LayerCapture``): the states that score
        each row's active tokens (positions ``t - 1``), reduced in the worker."""
        import torch

        from pytest_logprob_drift.numerics.layer_reduction import stack_reductions

        active = rollout["active_mask"]
        rows = sequences(rollout)
        wanted = [[int(j) for j in active[i, 1:].nonzero().flatten()] for i in range(len(rows))]
        self._layer_evidence = {}
        try:
            per_state, _layers, evidence = self.engine.capture_layers(rows, wanted)
        except ValueError as exc:
            raise LayersUnavailable(str(exc)) from None
        self._layer_evidence = dict(evidence)
        where = active[:, 1:].nonzero().to(torch.long)
        return stack_reductions(per_state, where)

    def arm_routing(self) -> None:
        """Arm the workers' routing capture for the case's generation (``engine.routing_arm``;
        ``execute.protocol.RolloutRoutingCapture``); ``RoutingUnavailable`` under compiled
        graphs or for a dense model."""
        try:
            layers = self.engine.routing_arm()
        except ValueError as exc:
            raise RoutingUnavailable(str(exc)) from None
        if layers == 0:
            self.engine.routing_collect()  # disarm
            raise RoutingUnavailable("the model has no mixture-of-experts layer")
        self._routing_layers = layers

    def collect_routing(self, rollout: TensorBatch) -> TensorBatch:
        """What the workers' routers chose while the engine generated the case's rows, rank 0's
        after checking every rank's digest, placed on the batch's grid by each request's tokens
        (``routing_rows.on_grid``); -1 at padding, at prompt tokens the prefix cache served and
        at each row's last sampled token."""
        from pytest_logprob_drift.runtimes.vllm.routing_rows import on_grid

        captured = self.engine.routing_collect()
        config = json.loads((Path(self.engine.spec.model_dir) / "config.json").read_text())
        ids, weights = on_grid(
            captured,
            rollout["token_ids"],
            rollout["attention_mask"],
            moe_layers=self._routing_layers,
            top_k=int(config["num_experts_per_tok"]),
        )
        return {"expert_ids": ids, "gate_weights": weights}

    def layer_capture_evidence(self) -> Mapping[str, JSONScalar]:
        """How the last ``capture_layers`` read the engine: its tensor parallel size, the TP
        rank whose reduction was kept (``read_rank``) and that every rank's agreed
        (``ranks_agree``; ``execute.protocol.LayerCaptureEvidence``)."""
        return dict(self._layer_evidence)

    def replay_decode(
        self,
        identity: ScoringIdentity,
        rollout: TensorBatch,
        *,
        batch_size: int,
        logp: LogpKernel | None,
    ) -> ReplayOutput:
        """vLLM's decode replay (``engine.replay_decode``: trace replay, model runner V2, the
        engine built with ``enable_trace_replay`` because the run asked for replay), in the
        case's chunks, with the rollout's temperature and seeds; ``ReplayUnavailable`` with the
        engine's reason where it has no trace replay (vLLM's CPU platform, model runner V1),
        or when the workers did not run the case's ``logp.backend`` on the replayed tokens
        (``execute.protocol.DecodeReplay``). Never run on a GPU here."""
        if not self.engine.trace_replay:
            raise ReplayUnavailable(self.engine.trace_replay_refusal())
        reference = _reference(logp)
        if reference is not None:
            self.engine.install_logp(reference)
        prompts = [list(p) for p in identity.prompts.token_ids]
        rows = sequences(rollout)
        responses = [row[len(prompt) :] for row, prompt in zip(rows, prompts, strict=True)]
        earlier = self.engine.read_back()
        try:
            values, scored, evidence = self.engine.replay_decode(
                prompts,
                responses,
                batch_size=batch_size,
                temperature=identity.sampling.temperature,
                seed=identity.sampling.seed,
            )
        except (ValueError, RuntimeError) as exc:
            raise ReplayUnavailable(str(exc)) from None
        live = self.engine.read_back()
        asked = backend_of(logp)
        ran, how = _logp_ran(
            logp, reference, earlier, live, rows=int(evidence["decoded_tokens"]), site=SAMPLED
        )
        if ran != asked:
            raise ReplayUnavailable(f"the decode replay did not run {asked}: {ran}")
        _eos, pad = self._special
        logprobs, token_ids = replay_grid(rollout, values, scored, pad)
        return ReplayOutput(
            logprobs=logprobs,
            token_ids=token_ids,
            evidence={
                "path": "vllm trace replay (trace_decode_token_ids), model runner V2",
                "logprob_semantics": str(live["logprobs_mode"]),
                "batch_size": batch_size,
                "logp_backend": asked,
                "logp_evidence": how,
                **evidence,
            },
        )

    def read_back(self) -> Mapping[str, ReadBackValue]:
        """``actual.json`` v2's rollout read-back: the knobs' values as scalars, and the parts
        that have parts (the weights that arrived, the sampling applied, each worker's logp
        injection, the engine's list and object values) as nested JSON, never as text."""
        live = self.engine.read_back()
        actual: dict[str, ReadBackValue] = {
            "rollout.dtype": str(live["dtype"]),
            "rollout.tensor_parallel_size": int(str(live["tensor_parallel_size"])),
            "rollout.context_parallel_size": self.engine.context_parallel_size(),
            "rollout.enable_prefix_caching": bool(live["enable_prefix_caching"]),
            "rollout.enforce_eager": eager_of(
                enforce_eager=bool(live["enforce_eager"]),
                compilation_mode=str(live["compilation_mode"]),
                cudagraph_mode=str(live["cudagraph_mode"]),
            ),
            "batch.size": self.batch_size,
            "logp.backend": self.backend_used,
            "vllm.logp_evidence": self.logp_evidence,
            "rollout.logprobs_mode": str(live["logprobs_mode"]),
            # The dtype of the logits the workers' samplers received (the LM head's output),
            # checked against the LogitsProcessor's head_dtype; the head weight stays in the
            # model's dtype either way (vllm.lm_head_dtype).
            "rollout.lm_head_dtype": lm_head_actual(
                requested=self.lm_head_requested,
                model_dtype=str(live["dtype"]),
                compute_dtype=str(live["lm_head_compute_dtype"]),
                logits_dtype=str(live["sampler_logits_dtype"]),
            ),
            # The sampling parameters the last call's requests ran with in the workers.
            "vllm.sampling_applied": read_back_part(self.sampling_observed),
            "rollout.device": str(live["platform"]),
            "launcher": self.launcher,
            "vllm.executor_requested": self.engine.executor_requested,
            "vllm.executor_reason": self.engine.executor_reason,
            "vllm.trace_replay": self.engine.trace_replay,
            "vllm.trace_replay_reason": self.engine.trace_replay_reason,
            # How the weights arrived: the push that really happened (empty while an engine
            # started without the checkpoint's weights has received none).
            "rollout.weight_sync": (
                self.weight_sync.knob_value
                if self.weights_in
                else "none: dummy weights, nothing pushed"
            ),
            "vllm.weights_arrived": read_back_part(self.weights_arrived),
            "vllm.prompt_tokens_cached": self.engine.prompt_tokens_cached,
        }
        for key, value in live.items():
            actual[f"vllm.{key}"] = read_back_part(value)
        return actual

    def weights(self) -> WeightsDocument:
        """The weight digests the workers took while loading (after the trainer's push, for a
        ``rollout.weight_sync`` push: ``VllmRolloutEngine.pushed_weights``), beside the
        checkpoint's cast to the engine's dtype (built once per engine, after its first case;
        every case on it seals the same). Once an operator was installed in the workers (code
        that runs in them), every tensor they still hold readably is read again from the live
        model."""
        if self._weights is None:
            from pytest_logprob_drift.runtimes.weights.side_document import side_document
            from pytest_logprob_drift.runtimes.weights.side_report import SideReport
            from pytest_logprob_drift.runtimes.weights.vllm_layout import overlay

            report = self.engine.loaded_weights
            via: dict[str, str] = {}
            if self.weights_in and not self.weight_sync.from_checkpoint:
                # Pushed weights: digested after the push and the prefix-cache reset, never
                # the dummy weights the engine was built with.
                pushed = self.engine.pushed_weights
                report = pushed if pushed is not None else SideReport(error="no push was digested")
                via = self._pushed_via
            if self._installed:
                report = overlay(report, self.engine.live_weights())
            self._weights = side_document(
                side="rollout",
                runtime="vllm",
                declared_dtype=self.engine.spec.dtype,
                report=report,
                model_dir=self.checkpoint.path,
                # Per tensor, what vLLM constructed it in (read before any weight was loaded)
                declared=report.declared or None,
                via=via or None,
            )
        return self._weights

    def close(self) -> None:
        self.engine.close()


class VllmHfAdapter(TransformersTrainingAdapter):
    """RuntimeAdapter of the ``vllm-hf`` runtime."""

    name = "vllm-hf"

    rollout_materialization: ClassVar[Mapping[str, Evidence]] = {
        "rollout.dtype": always("vllm.LLM(dtype=...)"),
        "rollout.tensor_parallel_size": _tensor_parallel,
        "rollout.context_parallel_size": _context_parallel,
        "rollout.expert_parallel": _expert_parallel,
        "rollout.enable_prefix_caching": always("vllm.LLM(enable_prefix_caching=...)"),
        "rollout.enforce_eager": always(
            "vllm.LLM(enforce_eager=...); False selects the compiled/graph path"
        ),
        "rollout.logprobs_mode": _logprobs_mode,
        "rollout.lm_head_dtype": per_value(
            {
                "compute": "vLLM's LM head (ParallelLMHead) is loaded and run in rollout.dtype "
                "(vllm.LLM(dtype=...)); read back from the dtype of the logits the workers' "
                "samplers receive"
            },
            otherwise="vllm.LLM(hf_overrides={'head_dtype': 'float32'}): the LogitsProcessor "
            "casts the final hidden states and the LM head weight (kept in rollout.dtype) to "
            "float32, so the sampler receives float32 logits; read back from the dtype of the "
            "logits the workers' samplers receive and the LogitsProcessor's head_dtype",
        ),
        "rollout.weight_sync": _weight_sync,
        "logp.backend": _logp_backend,
    }
    rollout_missing = "no vLLM setting for it"

    def rollout_resources(self, binding: RuntimeBinding) -> Mapping[str, float]:
        """vLLM's Ray executor holds one GPU per worker (TP x prefill CP); with one worker on
        CUDA the engine holds one GPU in this process, declared too so that no rank actor is
        packed onto it. Every engine is also built and driven from this process (its
        construction patches this process's environment and output), so at most one engine
        group with a vLLM engine runs at a time (``IN_PROCESS_ENGINE``)."""
        tp = binding.rollout_settings.tensor_parallel_size
        cp = binding.rollout_settings.context_parallel_size
        demand = {IN_PROCESS_ENGINE: 1.0}
        if self.launch.is_ray and str(binding.scorer["device"]) == "cuda":
            # TP x CP > 1: one GPU per Ray worker (vLLM's world is TP x prefill CP); TP 1:
            # the engine runs in this process, on a GPU Ray must not hand to a rank actor.
            demand["GPU"] = float(tp * cp)
        return demand

    def local_resources(self) -> Mapping[str, float]:
        return {IN_PROCESS_ENGINE: 1.0}

    def build_rollout(self, binding: RuntimeBinding, identity: ScoringIdentity) -> VllmRollout:
        tp = binding.rollout_settings.tensor_parallel_size
        cp = binding.rollout_settings.context_parallel_size
        return VllmRollout(
            binding,
            identity,
            self.checkpoint(identity),
            launcher=self.launch.launcher,
            ray_address=self.cluster_address() if tp * cp > 1 else None,
        )

    def environment(self, identity: ScoringIdentity) -> Mapping[str, str]:
        prepare_vllm_logging()
        import vllm

        return {**super().environment(identity), "vllm": str(vllm.__version__)}
