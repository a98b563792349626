"""The ``hf`` runtime: transformers generation against transformers teacher-forced scoring.

Owns the adapter that maps knobs onto a local Hugging Face checkpoint: the rollout side is
transformers on the KV-cache decode path with the identity's seeded sampling and mask policy; the
training side is the read-only teacher-forced forward, unsharded in this process or FSDP2 over real
torch.distributed rank processes (``training.sharding=fsdp``). Knobs it really applies: batch.size,
rollout.dtype, training.compute_dtype, training.attention_backend, logp.backend, training.sharding
and the sampling-semantics knobs (rollout.logprobs_mode, rollout.lm_head_dtype,
training.logprob_semantics, training.lm_head_dtype, unsharded and under FSDP alike); topology,
prefix caching and graph knobs exist only at their inherent value (``HF_INHERENT``, the one table of
them on the transformers side; anything else is ``unsupported`` and strict execution rejects it).
What each side does with each knob is one table keyed by knob (``TRAINING_MATERIALIZATION``,
``HfAdapter.rollout_materialization``). ``actual`` values are read back from the live models, their
device included (``rollout.device``, ``training.device``: both models are loaded on the scenario
device, a device this build cannot offer is a one-line UsageError). Also hosts the training side
reused by ``vllm-hf``. Knows nothing about planning, comparison, verdicts, artifacts, the CLI or
pytest; the engines below it know nothing of knobs.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch

from pytest_logprob_drift.errors import RuntimeFailure, UsageError
from pytest_logprob_drift.execute import protocol as runtime
from pytest_logprob_drift.execute.launch import Launch
from pytest_logprob_drift.execute.protocol import (
    BoundKernel,
    LayersUnavailable,
    LogpKernel,
    Materialized,
    ReplayOutput,
    RolloutOutput,
    RoutingUnavailable,
    RuntimeBinding,
    TensorBatch,
    TrainingOutput,
    backend_of,
)
from pytest_logprob_drift.execute.readonly import ReadOnlyGuard, state_digest
from pytest_logprob_drift.execute.side_settings import RouterDtype
from pytest_logprob_drift.numerics.sampling import Truncation
from pytest_logprob_drift.plan.binding import FSDP_WORLD_SIZE
from pytest_logprob_drift.records import JSONScalar, KnobValue, ScoringIdentity
from pytest_logprob_drift.runtimes import ray_cluster
from pytest_logprob_drift.runtimes.batch import active_rows
from pytest_logprob_drift.runtimes.materialization import (
    Evidence,
    always,
    applied,
    materialized,
    only,
    per_value,
    unsupported,
)
from pytest_logprob_drift.runtimes.ray_cluster import ClusterLease
from pytest_logprob_drift.runtimes.tiny_model import (
    CheckpointError,
    ResolvedCheckpoint,
    resolve_checkpoint,
    special_token_ids,
)
from pytest_logprob_drift.runtimes.transformers import engine as hf_engine
from pytest_logprob_drift.runtimes.transformers import moe
from pytest_logprob_drift.runtimes.transformers.fsdp import FsdpScorerError, FsdpScorerGroup
from pytest_logprob_drift.runtimes.weights.checkpoint import checkpoint_names
from pytest_logprob_drift.runtimes.weights.module_digests import module_report
from pytest_logprob_drift.runtimes.weights.side_document import side_document
from pytest_logprob_drift.store.documents import WeightsDocument, WeightSide
from pytest_logprob_drift.store.read_back import read_back_part

ROLLOUT_ATTENTION = "sdpa"

HF_INHERENT: Mapping[str, KnobValue] = {
    "rollout.tensor_parallel_size": 1,
    "rollout.context_parallel_size": 1,
    "rollout.enable_prefix_caching": False,
    "rollout.enforce_eager": True,
    "rollout.weight_sync": "checkpoint",
}


def _attention_backend(path: str, value: KnobValue) -> Materialized:
    if value not in hf_engine.ATTN_IMPLEMENTATIONS:
        return unsupported(path, value, "not available on this device/build")
    if (why := hf_engine.attention_unavailable(str(value))) is not None:
        return unsupported(path, value, why)
    return applied(value, "from_pretrained(attn_implementation=...)")


TRAINING_MATERIALIZATION: Mapping[str, Evidence] = {
    "batch.size": always("both sides process the prompts in chunks of this size"),
    "training.compute_dtype": always("from_pretrained(dtype=...) for the training model"),
    "training.attention_backend": _attention_backend,
    "training.sharding": per_value(
        {"none": "one unsharded model in this process"},
        otherwise=f"FSDP2 fully_shard over {FSDP_WORLD_SIZE} torch.distributed rank processes",
    ),
    "training.logprob_semantics": per_value(
        {
            "processed": "the trainer divides the logits by the sampling temperature and "
            "applies the sampler's min_p/top_k/top_p truncation before the log-softmax"
        },
        otherwise="log-softmax of the raw logits",
    ),
    "training.lm_head_dtype": per_value(
        {
            "float32": "the LM head in float32 (in process: an untied float32 copy of its "
            "weight; under FSDP: its output recomputed from a float32 copy of the unsharded "
            "weight); the final hidden states are upcast on their way in, so the logits are "
            "float32"
        },
        otherwise="the LM head runs in training.compute_dtype",
    ),
    "training.moe_routing": per_value(
        {
            "natural": "the training router's own top-k choice",
            "replay": "R3: a forward hook on every MoE router takes the rollout's expert ids per "
            "token and layer (handed to the scorer's call) and weights them from the float32 "
            "softmax of its own router logits",
        },
        otherwise="test-only planted routing change: a forward hook on the MoE router of "
        "the named layer swaps each token's last chosen expert",
    ),
    "training.router_dtype": per_value(
        {
            "float32": "a forward hook on every MoE router recomputes the gate GEMM with its "
            "input and weight upcast to float32 (the weight itself stays in the model dtype)"
        },
        otherwise="the gate GEMM in the model dtype (softmax and top-k in float32)",
    ),
}
"""Training-side and shared knobs, common to every runtime whose trainer is transformers."""


def scenario_device(binding: RuntimeBinding) -> str:
    """The device the case's scenario names (``cpu`` or ``cuda``): where both sides' models
    are placed."""
    return str(binding.scorer["device"])


def load_on_device(
    model_dir: Path, *, dtype: str, attn_implementation: str, device: str, lm_head_dtype: str
) -> Any:
    """``engine.load_model`` on the scenario device, with the live device read back from the
    model's parameters: a model that is not on that device is a ``RuntimeFailure`` (numbers
    measured elsewhere would be recorded as this device's), and a device this build or
    machine cannot offer is a ``UsageError`` naming it."""
    try:
        model = hf_engine.load_model(
            model_dir,
            dtype=dtype,
            attn_implementation=attn_implementation,
            device=device,
            lm_head_dtype=lm_head_dtype,
        )
    except hf_engine.DeviceUnavailable as exc:
        raise UsageError(f"scenario.device: {exc}") from None
    live = hf_engine.live_device(model)
    if live.type != torch.device(device).type:
        raise RuntimeFailure(f"the model was asked for device {device!r} but is on {str(live)!r}")
    return model


def lm_head_knob(head_dtype: str, body_dtype: str, requested: str) -> str:
    """The ``*.lm_head_dtype`` knob value a live LM head dtype shows: ``float32`` or
    ``compute``; with a float32 body both are true, and the request's spelling is kept."""
    if head_dtype == body_dtype == "float32":
        return requested
    if head_dtype == body_dtype:
        return "compute"
    return head_dtype


def sampling_truncation(identity: ScoringIdentity) -> Truncation:
    return Truncation.of(identity.sampling)


def reported_sampling(truncation: Truncation) -> dict[str, JSONScalar]:
    """The truncation a transformers side applies, as identity validation reads it."""
    return runtime.applied_sampling(
        top_p=truncation.top_p, top_k=truncation.top_k, min_p=truncation.min_p
    )


def resolve_identity_checkpoint(identity: ScoringIdentity) -> ResolvedCheckpoint:
    try:
        return resolve_checkpoint(
            identity.checkpoint.uri, expected_digest=identity.checkpoint.digest
        )
    except CheckpointError as exc:
        raise UsageError(f"identity.checkpoint: {exc.message}") from None


@functools.cache
def tokenizer_digest(model_dir: Path) -> str:
    digest = hashlib.sha256()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        path = model_dir / name
        digest.update(name.encode())
        digest.update(path.read_bytes() if path.is_file() else b"<absent>")
    return digest.hexdigest()


def side_identity(
    identity: ScoringIdentity, checkpoint: ResolvedCheckpoint
) -> dict[str, JSONScalar]:
    """What one side actually loaded (digests read from its own files)."""
    return runtime.side_identity(
        identity,
        checkpoint_digest=checkpoint.digest,
        tokenizer_digest=tokenizer_digest(checkpoint.path),
    )


def module_weights(
    model: Any, model_dir: Path, *, side: WeightSide, dtype: str, lm_head_dtype: str
) -> WeightsDocument:
    """A module's weight document (``module_digests``): the checkpoint cast to ``dtype``; an
    LM head held in float32 by ``lm_head_dtype`` declared float32, through ``dtype`` (it is a
    float32 copy of the head the body's dtype loaded) and, where the checkpoint ties it (holds
    no ``lm_head.weight``), compared with the embedding it was copied from."""
    names = set(checkpoint_names(model_dir))
    head = "lm_head.weight"
    upcast = lm_head_dtype == "float32" and hf_engine.dtype_name(_head_weight(model).dtype) == (
        "float32"
    )
    derived = (
        {head: "model.embed_tokens.weight"}
        if upcast and head not in names and "model.embed_tokens.weight" in names
        else {}
    )
    report = module_report(model, names | set(derived))
    state = dict(model.named_parameters(remove_duplicate=False))
    own = {**kept_in_float32(model, dtype, names), **({head: "float32"} if upcast else {})}
    return side_document(
        side=side,
        runtime="transformers",
        declared_dtype=dtype,
        report=report,
        model_dir=model_dir,
        declared=own or None,
        via={head: dtype} if upcast and dtype != "float32" else None,
        derived=derived,
        side_tensor=state.get,
    )


def kept_in_float32(model: Any, dtype: str, names: set[str]) -> dict[str, str]:
    """The checkpoint names ``model``'s class keeps in float32 when loaded in ``dtype``,
    declared float32: what the class declares (``_keep_in_fp32_modules_strict`` for bfloat16
    and float16, ``_keep_in_fp32_modules`` for float16) through transformers' own dtype plan
    and pattern match at load (``PreTrainedModel._get_dtype_plan``,
    ``core_model_loading.build_glob_alternation``). GLM4-MoE's router
    ``e_score_correction_bias`` is one: a float32 buffer in a bfloat16 model."""
    from transformers.core_model_loading import build_glob_alternation

    plan_of = getattr(model, "_get_dtype_plan", None)
    target = getattr(torch, dtype, None)
    if not callable(plan_of) or not isinstance(target, torch.dtype):
        return {}
    kept = [k for k, v in plan_of(target).items() if v == torch.float32]
    if not kept:
        return {}
    pattern, _, _ = build_glob_alternation(kept)
    return {n: "float32" for n in sorted(names) if pattern.search(n)}


def _head_weight(model: Any) -> Any:
    head = model.get_output_embeddings()
    return getattr(head, "weight", torch.empty(0))


class HfRollout:
    """transformers generation on the KV-cache decode path."""

    def __init__(self, binding: RuntimeBinding, checkpoint: ResolvedCheckpoint) -> None:
        self.construction_fingerprint = binding.rollout_construction_fingerprint
        self.checkpoint = checkpoint
        settings = binding.rollout_settings
        self.lm_head_dtype = settings.lm_head_dtype.value
        self.dtype = settings.dtype.value
        self.device = scenario_device(binding)
        self.model = load_on_device(
            self.checkpoint.path,
            dtype=self.dtype,
            attn_implementation=ROLLOUT_ATTENTION,
            device=self.device,
            lm_head_dtype=self.lm_head_dtype,
        )
        self.logprobs_mode = settings.logprobs_mode.value
        self.full_vocabulary = binding.full_vocabulary is not None
        self.batch_size = 0
        self.backend_used = ""
        self._routing: moe.GenerationRouting | None = None
        self.mode_used = ""
        self._weights: WeightsDocument | None = None

    def generate(
        self, identity: ScoringIdentity, *, batch_size: int, logp: LogpKernel | None
    ) -> RolloutOutput:
        eos, pad = special_token_ids(self.checkpoint.path)
        self.batch_size = batch_size
        self.backend_used = backend_of(logp)
        sampling = identity.sampling
        truncation = sampling_truncation(identity)
        steps: list[list[torch.Tensor]] | None = [] if self.full_vocabulary else None
        tensors = hf_engine.hf_rollout(
            self.model,
            identity.prompts.token_ids,
            seed=sampling.seed,
            max_new_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            eos_token_id=eos,
            pad_token_id=pad,
            batch_size=batch_size,
            logp_fn=logp or hf_engine.native_selected_logprob,
            mask_policy=identity.mask_policy,
            truncation=truncation,
            logprobs_mode=self.logprobs_mode,
            steps=steps,
        )
        self.mode_used = self.logprobs_mode
        return RolloutOutput(
            tensors=tensors,
            identity={
                **side_identity(identity, self.checkpoint),
                **reported_sampling(truncation),
            },
            full_vocab=None if steps is None else active_rows(steps, tensors["active_mask"]),
        )

    def arm_routing(self) -> None:
        """Hook the rollout model's routers for the case's generation
        (``moe.GenerationRouting``; ``execute.protocol.RolloutRoutingCapture``);
        ``RoutingUnavailable`` for a dense model."""
        if self._routing is not None:
            self._routing.close()
        try:
            self._routing = moe.GenerationRouting(self.model)
        except ValueError as exc:
            raise RoutingUnavailable(str(exc)) from None

    def collect_routing(self, rollout: TensorBatch) -> TensorBatch:
        """What the routers chose while the model generated the case's rows, on the batch's
        grid: -1 at padding and at each row's last sampled token."""
        if self._routing is None:
            raise RoutingUnavailable("the routing capture was not armed before the generation")
        recorder, self._routing = self._routing, None
        captured = recorder.on_grid(rollout["token_ids"], rollout["attention_mask"])
        return {"expert_ids": captured.expert_ids, "gate_weights": captured.gate_weights}

    def replay_prefill(
        self,
        identity: ScoringIdentity,
        rollout: TensorBatch,
        *,
        batch_size: int,
        logp: LogpKernel | None,
    ) -> ReplayOutput:
        """Prefill replay: a teacher-forced forward of the rollout model itself (its dtype,
        attention implementation and LM head) over the sampled sequences, in chunks of the
        case's ``batch_size``, reporting the kind of logprob the rollout reports
        (``execute.protocol.PrefillReplay``)."""
        processed = self.logprobs_mode == "processed_logprobs"
        logprobs = hf_engine.hf_teacher_forced_score(
            self.model,
            {k: rollout[k] for k in hf_engine.SCORER_KEYS},
            batch_size=batch_size,
            logp_fn=logp or hf_engine.native_selected_logprob,
            processed=sampling_truncation(identity) if processed else None,
        )
        return ReplayOutput(
            logprobs=logprobs,
            token_ids=rollout["token_ids"],
            evidence={
                "path": "transformers teacher-forced forward of the rollout model",
                "logprob_semantics": "processed" if processed else "raw",
                "batch_size": batch_size,
                "attn_implementation": ROLLOUT_ATTENTION,
                "use_cache": False,
            },
        )

    def capture_layers(
        self, identity: ScoringIdentity, rollout: TensorBatch, *, batch_size: int
    ) -> Mapping[str, torch.Tensor]:
        """The rollout side's layer capture on its prefill replay path: a teacher-forced
        forward of the rollout model itself with hooks (``layer_capture``;
        ``execute.protocol.LayerCapture``)."""
        from pytest_logprob_drift.runtimes.transformers.layer_capture import capture_layers

        return capture_layers(self.model, rollout, batch_size=batch_size)

    def replay_decode(
        self,
        identity: ScoringIdentity,
        rollout: TensorBatch,
        *,
        batch_size: int,
        logp: LogpKernel | None,
    ) -> ReplayOutput:
        """Decode replay: the sampled tokens forced through the rollout's own KV-cache decode
        path again (``hf_engine.hf_forced_decode``; ``execute.protocol.DecodeReplay``)."""
        _eos, pad = special_token_ids(self.checkpoint.path)
        processed = self.logprobs_mode == "processed_logprobs"
        logprobs, fed = hf_engine.hf_forced_decode(
            self.model,
            rollout,
            batch_size=batch_size,
            logp_fn=logp or hf_engine.native_selected_logprob,
            pad_token_id=pad,
            truncation=sampling_truncation(identity),
            logprobs_mode=self.logprobs_mode,
        )
        return ReplayOutput(
            logprobs=logprobs,
            token_ids=fed,
            evidence={
                "path": "transformers forced KV-cache decoding (DynamicCache)",
                "logprob_semantics": "processed" if processed else "raw",
                "batch_size": batch_size,
                "attn_implementation": ROLLOUT_ATTENTION,
            },
        )

    def read_back(self) -> Mapping[str, JSONScalar]:
        live = hf_engine.read_back(self.model)
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        return {
            "rollout.dtype": str(live["param_dtype"]),
            "batch.size": self.batch_size,
            "logp.backend": self.backend_used,
            **HF_INHERENT,
            "rollout.tensor_parallel_size": world,
            "rollout.logprobs_mode": self.mode_used,
            "rollout.lm_head_dtype": lm_head_knob(
                str(live["lm_head_dtype"]), str(live["param_dtype"]), self.lm_head_dtype
            ),
            "rollout.device": str(live["device"]),
        }

    def weights(self) -> WeightsDocument:
        """The rollout model's weight digests beside the checkpoint's (once per engine)."""
        if self._weights is None:
            self._weights = module_weights(
                self.model,
                self.checkpoint.path,
                side="rollout",
                dtype=self.dtype,
                lm_head_dtype=self.lm_head_dtype,
            )
        return self._weights

    def close(self) -> None:
        del self.model


class HfTrainingScorer:
    """Read-only teacher-forced scoring: in process, or FSDP2 over rank processes."""

    def __init__(
        self,
        binding: RuntimeBinding,
        checkpoint: ResolvedCheckpoint,
        launch: Launch | None = None,
    ) -> None:
        self.construction_fingerprint = binding.training_construction_fingerprint
        self.checkpoint = checkpoint
        self.launcher = (launch or Launch()).launcher
        settings = binding.training_settings
        self.dtype = settings.compute_dtype.value
        self.attention = settings.attention_backend.value
        self.sharded = settings.sharded
        self.semantics = settings.logprob_semantics.value
        self.lm_head_dtype = settings.lm_head_dtype.value
        self.moe_routing = settings.moe_routing
        self.router_float32 = settings.router_dtype is RouterDtype.FLOAT32
        self.full_vocabulary = binding.full_vocabulary is not None
        self.model: Any = None
        self.group: FsdpScorerGroup | None = None
        if self.sharded:
            launch = launch or Launch()
            device = str(binding.scorer["device"])
            if launch.is_ray:
                from pytest_logprob_drift.runtimes.transformers import fsdp_ray

                self.group = fsdp_ray.RayFsdpScorerGroup(
                    self.checkpoint.path,
                    rank_cpus=launch.rank_cpus,
                    dtype=self.dtype,
                    attn_implementation=self.attention,
                    world_size=FSDP_WORLD_SIZE,
                    device=device,
                )
            else:
                self.group = FsdpScorerGroup(
                    self.checkpoint.path,
                    dtype=self.dtype,
                    attn_implementation=self.attention,
                    world_size=FSDP_WORLD_SIZE,
                    device=device,
                )
        else:
            self.model = load_on_device(
                self.checkpoint.path,
                dtype=self.dtype,
                attn_implementation=self.attention,
                device=scenario_device(binding),
                lm_head_dtype=self.lm_head_dtype,
            )
        self.batch_size = 0
        self.backend_used = ""
        self.semantics_used = ""
        self.evidence: dict[str, Any] = {}
        self._layer_evidence: dict[str, JSONScalar] = {}
        self._truncation = Truncation(temperature=1.0)
        self._full: list[torch.Tensor] | None = None
        self._weights: WeightsDocument | None = None
        self._routers_used: dict[str, JSONScalar] = {}

    def score(
        self,
        identity: ScoringIdentity,
        rollout: TensorBatch,
        *,
        batch_size: int,
        logp: LogpKernel | None,
        rollout_routing: torch.Tensor | None = None,
    ) -> TrainingOutput:
        self.batch_size = batch_size
        self.backend_used = backend_of(logp)
        self._truncation = sampling_truncation(identity)
        self._full = [] if self.full_vocabulary else None
        consumed = {k: rollout[k] for k in hf_engine.SCORER_KEYS}
        if self.group is not None:
            if not (self.moe_routing.natural and not self.router_float32):
                raise RuntimeFailure("the FSDP rank processes have no router hooks")
            logprobs, violations = self._score_sharded(self.group, consumed, batch_size, logp)
            self.semantics_used = str(self.evidence.get("logprob_semantics", ""))
        else:
            override = self._router_override(consumed, batch_size, rollout_routing)
            with override if override is not None else contextlib.nullcontext():
                logprobs, violations = self._score_here(identity, consumed, batch_size, logp)
            self._routers_used = self._routers_observed(override)
            self.semantics_used = self.semantics
        full, self._full = self._full, None
        return TrainingOutput(
            logprobs=logprobs,
            consumed=consumed,
            identity={
                **side_identity(identity, self.checkpoint),
                **reported_sampling(self._truncation),
            },
            readonly_violations=violations,
            evidence={k: read_back_part(v) for k, v in self.evidence.items()},
            full_vocab=torch.cat(full) if full else None,
        )

    def capture_layers(
        self, identity: ScoringIdentity, rollout: TensorBatch, *, batch_size: int
    ) -> Mapping[str, torch.Tensor]:
        """The training side's layer capture: its teacher-forced forward once more, with
        hooks (``layer_capture``; ``execute.protocol.LayerCapture``): on the in-process model,
        or in the FSDP rank processes (``FsdpScorerGroup.capture_layers``, the LM head as the
        scores had it), whose reductions must agree (else ``LayersUnavailable`` says so)."""
        consumed = {k: rollout[k] for k in hf_engine.SCORER_KEYS}
        if self.group is not None:
            try:
                tensors, evidence = self.group.capture_layers(
                    consumed, batch_size=batch_size, lm_head_dtype=self.lm_head_dtype
                )
            except FsdpScorerError as exc:
                raise LayersUnavailable(f"the FSDP ranks' layer capture failed: {exc}") from None
            self._layer_evidence = {
                "world_size": int(str(evidence["world_size"])),
                "ranks_agree": bool(evidence["ranks_agree"]),
            }
            return tensors
        from pytest_logprob_drift.runtimes.transformers.layer_capture import capture_layers

        self._layer_evidence = {}
        return capture_layers(self.model, consumed, batch_size=batch_size)

    def _routers_observed(self, override: moe.RouterOverride | None) -> dict[str, JSONScalar]:
        """What the router hooks did in the last score, as the two knobs' read-back: a value
        other than the default only where its hook changed at least one router call."""
        if override is None:
            return {"training.moe_routing": "natural", "training.router_dtype": "model"}
        routing = "natural"
        if self.moe_routing.replay and override.replayed_tokens > 0:
            routing = "replay"
        elif self.moe_routing.planted is not None and override.flipped_calls > 0:
            routing = self.moe_routing.knob_value
        return {
            "training.moe_routing": routing,
            "training.router_dtype": "float32" if override.float32_calls > 0 else "model",
        }

    def _router_override(
        self, batch: TensorBatch, batch_size: int, rollout_routing: torch.Tensor | None
    ) -> moe.RouterOverride | None:
        """The router knobs' hooks for one pass over ``batch`` (None: every router natural
        and in the model dtype); replay without the rollout's expert ids is a RuntimeFailure."""
        if self.moe_routing.natural and not self.router_float32:
            return None
        if self.moe_routing.replay and rollout_routing is None:
            raise RuntimeFailure(
                "training.moe_routing=replay: the scorer's call carries no rollout expert ids"
            )
        planted = self.moe_routing.planted
        try:
            return moe.RouterOverride(
                self.model,
                batch["attention_mask"],
                batch_size=batch_size,
                float32=self.router_float32,
                replay=rollout_routing if self.moe_routing.replay else None,
                flip_layer=None if planted is None else planted.flip_layer,
            )
        except ValueError as exc:
            raise RuntimeFailure(
                f"training.moe_routing={self.moe_routing.knob_value}, training.router_dtype="
                f"{'float32' if self.router_float32 else 'model'}: {exc}"
            ) from None

    def capture_routing(
        self,
        rollout: TensorBatch,
        *,
        batch_size: int,
        rollout_routing: torch.Tensor | None = None,
    ) -> TensorBatch:
        """The training side's routing (``moe.capture_routing``: a hook on every MoE layer's
        router in a teacher-forced forward with the scorer's chunks and masks;
        ``execute.protocol.TrainingRoutingCapture``), on the in-process model, under the same
        router knobs as its scores (``rollout_routing``: the rollout's expert ids replay
        takes); under FSDP and for a dense model ``RoutingUnavailable`` says why."""
        if self.group is not None:
            raise RoutingUnavailable(
                "the trainer runs in FSDP rank processes, which have no routing capture yet"
            )
        if not moe.moe_routers(self.model):
            raise RoutingUnavailable("the model has no mixture-of-experts layer")
        consumed = {k: rollout[k] for k in hf_engine.SCORER_KEYS}
        override = self._router_override(consumed, batch_size, rollout_routing)
        with override if override is not None else contextlib.nullcontext():
            captured = moe.capture_routing(self.model, consumed, batch_size=batch_size)
        return {"expert_ids": captured.expert_ids, "gate_weights": captured.gate_weights}

    def weight_state(self) -> Mapping[str, torch.Tensor]:
        """The training model's parameters and persistent buffers by checkpoint name, whole
        and in the side's dtype (``execute.protocol.WeightSource``): unsharded, the live
        module's; under FSDP2 every rank gathers them with ``full_tensor()`` and rank 0's copy
        crosses back (``FsdpScorerGroup.gather_weights``; its evidence is kept in
        ``weight_gather``)."""
        from pytest_logprob_drift.runtimes.weight_push import gathered_state

        if self.group is not None:
            state, evidence = self.group.gather_weights()
            self.weight_gather = dict(evidence)
            return state
        self.weight_gather = {"world_size": 1}
        return gathered_state(self.model)

    def layer_capture_evidence(self) -> Mapping[str, JSONScalar]:
        """How the last layer capture ran (``execute.protocol.LayerCaptureEvidence``): under
        FSDP, the ranks' ``world_size`` and ``ranks_agree``; nothing in process."""
        return dict(self._layer_evidence)

    def _score_sharded(
        self, group: FsdpScorerGroup, batch: TensorBatch, batch_size: int, logp: LogpKernel | None
    ) -> tuple[torch.Tensor, tuple[str, ...]]:
        """Score in the FSDP rank processes, which import the kernel by its reference."""
        factory = (
            hf_engine.NATIVE_LOGP
            if logp is None
            else (logp.factory if isinstance(logp, BoundKernel) else None)
        )
        if factory is None:
            raise RuntimeFailure(
                f"logp backend {self.backend_used!r} cannot be imported "
                "by name inside FSDP rank processes"
            )
        logprobs, evidence = group.score(
            batch,
            batch_size=batch_size,
            logp_backend=factory,
            processed=self._truncation if self.semantics == "processed" else None,
            lm_head_dtype=self.lm_head_dtype,
            full_vocab=self._full,
        )
        self.evidence = {**evidence, **group.launch_evidence()}
        violations = evidence.get("readonly_violations", [])
        return logprobs, tuple(str(v) for v in violations) if isinstance(violations, list) else ()

    def _score_here(
        self,
        identity: ScoringIdentity,
        batch: TensorBatch,
        batch_size: int,
        logp: LogpKernel | None,
    ) -> tuple[torch.Tensor, tuple[str, ...]]:
        """Score with the in-process model under the read-only guard."""
        guard = ReadOnlyGuard(self.model, kv_cache_allowed=identity.training_kv_cache)
        with guard.watch():
            logprobs = self._forward(batch, batch_size, logp)
        self.evidence = {
            "state_digest_before": guard.digest_before,
            "state_digest_after": guard.digest_after,
            "model_state_digest": state_digest(self.model),
            "forward_calls": guard.forward_calls,
            "world_size": 1,
        }
        return logprobs, tuple(guard.violations)

    def _forward(
        self, batch: TensorBatch, batch_size: int, logp: LogpKernel | None
    ) -> torch.Tensor:
        """The teacher-forced forward, run under the read-only guard."""
        return hf_engine.hf_teacher_forced_score(
            self.model,
            batch,
            batch_size=batch_size,
            logp_fn=logp or hf_engine.native_selected_logprob,
            processed=self._truncation if self.semantics == "processed" else None,
            full_vocab=self._full,
        )

    def read_back(self) -> Mapping[str, JSONScalar]:
        moe_read_back: dict[str, JSONScalar] = {}  # in process only (FSDP ranks: not yet)
        if self.group is not None:
            ev = self.evidence
            world = int(ev.get("world_size", 0))
            dtype = str(ev.get("param_dtype", ""))
            attention = str(ev.get("attn_implementation", ""))
            sharding = "fsdp" if ev.get("fsdp") == "fully_shard" and world > 1 else "none"
            head = str(ev.get("lm_head_dtype", ""))  # the logits dtype the ranks' head produced
            device = str(ev.get("device", ""))
        else:
            live = hf_engine.read_back(self.model)
            dtype, attention, sharding, head, device = (
                str(live["param_dtype"]),
                str(live["attn_implementation"]),
                "none",
                str(live["lm_head_dtype"]),
                str(live["device"]),
            )
            experts = moe.experts_implementation(self.model)
            if experts is not None:
                moe_read_back = {"training.experts_implementation": experts, **self._routers_used}
        return {
            **moe_read_back,
            "training.compute_dtype": dtype,
            "training.attention_backend": attention,
            "training.sharding": sharding,
            "training.logprob_semantics": self.semantics_used,
            "training.lm_head_dtype": lm_head_knob(head, dtype, self.lm_head_dtype),
            "batch.size": self.batch_size,
            "logp.backend": self.backend_used,
            "launcher": self.launcher,
            "training.device": device,
        }

    def weights(self) -> WeightsDocument:
        """The scorer's weight digests beside the checkpoint's cast to its compute dtype (once
        per scorer): in process, the module as loaded (a float32 LM head declared float32,
        compared with the embedding it copies when the checkpoint ties them); under FSDP,
        what the ranks gathered right after sharding."""
        if self._weights is None:
            self._weights = (
                module_weights(
                    self.model,
                    self.checkpoint.path,
                    side="training",
                    dtype=self.dtype,
                    lm_head_dtype=self.lm_head_dtype,
                )
                if self.group is None
                else side_document(
                    side="training",
                    runtime="transformers-fsdp",
                    declared_dtype=self.dtype,
                    report=self.group.weights_report(),
                    model_dir=self.checkpoint.path,
                )
            )
        return self._weights

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
        self.model = None


class TransformersTrainingAdapter(abc.ABC):
    """Shared half of the adapters whose training side is the transformers scorer: training
    knobs, the scorer, the environment; a subclass supplies the rollout side."""

    name = ""

    def __init__(self) -> None:
        self._checkpoints: dict[tuple[str, str | None], ResolvedCheckpoint] = {}
        self.launch = Launch()
        self._lease: ClusterLease | None = None

    def use_launch(self, launch: Launch) -> None:
        """The execution policy's launcher (``execute.launch.LaunchAware``). Under ray, a local
        cluster starts in the background now, while the first engines load."""
        self.launch = launch
        if launch.is_ray and self._lease is None:
            ray_cluster.start_in_background(launch)

    def cluster_address(self) -> str | None:
        """Under the ray launcher: the cluster's address (connected, or started, on first
        use and released by ``close``); None under ``local``."""
        if not self.launch.is_ray:
            return None
        if self._lease is None:
            self._lease = ray_cluster.acquire(self.launch)
        return self._lease.address

    def checkpoint(self, identity: ScoringIdentity) -> ResolvedCheckpoint:
        """The identity's checkpoint, resolved and digest-checked once per adapter (a large
        local checkpoint is hashed once per run, not once per case and engine)."""
        key = (identity.checkpoint.uri, identity.checkpoint.digest)
        if key not in self._checkpoints:
            self._checkpoints[key] = resolve_identity_checkpoint(identity)
        return self._checkpoints[key]

    rollout_materialization: ClassVar[Mapping[str, Evidence]]
    """What this runtime's rollout side does with each knob the training side does not
    state (``TRAINING_MATERIALIZATION``)."""
    rollout_missing: ClassVar[str]
    """Why a knob neither table holds is unsupported."""

    def materialize(self, requested: Mapping[str, KnobValue]) -> Mapping[str, Materialized]:
        return {path: self.materialize_knob(path, value) for path, value in requested.items()}

    def materialize_knob(self, path: str, value: KnobValue) -> Materialized:
        """What this runtime does with one knob: the training table's row, else the
        rollout's."""
        if path in TRAINING_MATERIALIZATION:
            return TRAINING_MATERIALIZATION[path](path, value)
        return self.materialize_rollout(path, value)

    def materialize_rollout(self, path: str, value: KnobValue) -> Materialized:
        """What this runtime's rollout side does with one non-training knob."""
        return materialized(self.rollout_materialization, path, value, missing=self.rollout_missing)

    def engine_resources(self, binding: RuntimeBinding) -> Mapping[str, float]:
        """What one case's engines hold on the cluster (``execute.launch.ResourceAware``):
        under ray, the FSDP rank actors (one bundle per rank: a GPU each on CUDA, else the
        launch policy's CPUs per rank) plus the rollout's (``rollout_resources``)."""
        if not self.launch.is_ray:
            return {}
        demand: dict[str, float] = dict(self.rollout_resources(binding))
        if binding.training_settings.sharded:
            if str(binding.scorer["device"]) == "cuda":
                demand["GPU"] = demand.get("GPU", 0.0) + FSDP_WORLD_SIZE
            else:
                demand["CPU"] = demand.get("CPU", 0.0) + FSDP_WORLD_SIZE * self.launch.rank_cpus
        return demand

    def rollout_resources(self, binding: RuntimeBinding) -> Mapping[str, float]:
        """Cluster resources of the rollout side: it runs in this process; on CUDA it holds
        one GPU there, declared so that no FSDP rank actor is packed onto it."""
        return {"GPU": 1.0} if scenario_device(binding) == "cuda" else {}

    def cluster_resources(self) -> Mapping[str, float]:
        """The cluster's free resources (connecting to it, or starting it, first), plus what
        this process offers its in-process engines (``local_resources``)."""
        self.cluster_address()
        return {**ray_cluster.free_resources(), **self.local_resources()}

    def local_resources(self) -> Mapping[str, float]:
        """Resources of this process that engines running in it declare (none here)."""
        return {}

    def build_training(
        self, binding: RuntimeBinding, identity: ScoringIdentity
    ) -> HfTrainingScorer:
        if binding.training_settings.sharded:
            self.cluster_address()  # the rank actors need the cluster
        return HfTrainingScorer(binding, self.checkpoint(identity), self.launch)

    def environment(self, identity: ScoringIdentity) -> Mapping[str, str]:
        return {"runtime": self.name, "checkpoint_digest": self.checkpoint(identity).digest}

    def close(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()
        elif self.launch.is_ray:
            ray_cluster.abandon_background_start()


class HfAdapter(TransformersTrainingAdapter):
    """RuntimeAdapter of the ``hf`` runtime."""

    name = "hf"

    rollout_materialization: ClassVar[Mapping[str, Evidence]] = {
        "rollout.dtype": always("from_pretrained(dtype=...) for the rollout model"),
        "rollout.expert_parallel": only(
            False,
            "every expert in the one rollout model",
            why="the transformers rollout is one unsharded model: no expert parallelism",
        ),
        "logp.backend": always("the bound kernel scores the raw logits on both sides"),
        "rollout.logprobs_mode": per_value(
            {
                "processed_logprobs": "the rollout reports the logprobs of the processed "
                "logits it samples from (temperature, min_p/top_k/top_p truncation, "
                "renormalized)"
            },
            otherwise="the rollout reports the logprobs of the raw logits",
        ),
        "rollout.lm_head_dtype": per_value(
            {
                "float32": "an untied float32 copy of the rollout model's LM head; the final "
                "hidden states are upcast on their way in, so the sampled logits are float32"
            },
            otherwise="the rollout's LM head runs in rollout.dtype",
        ),
        **{
            path: only(
                value,
                "the only value transformers generation has here",
                why="transformers generation cannot apply it",
            )
            for path, value in HF_INHERENT.items()
        },
        "rollout.weight_sync": only(
            HF_INHERENT["rollout.weight_sync"],
            "the only value transformers generation has here",
            why="the hf rollout is a second transformers model in this process, loaded with "
            "from_pretrained; it has no engine load path a push could exercise (a push "
            "would be load_state_dict of the same tensors), so only checkpoint applies",
        ),
    }
    rollout_missing = "transformers generation cannot apply it"

    def build_rollout(self, binding: RuntimeBinding, identity: ScoringIdentity) -> HfRollout:
        return HfRollout(binding, self.checkpoint(identity))
