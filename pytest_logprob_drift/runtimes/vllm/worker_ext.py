"""A vLLM worker extension: per-worker set-up and per-worker facts the rollout engine needs.

Owns ``DriftWorkerExtension``, mixed into every vLLM worker through ``LLM(worker_extension_cls=
...)`` and called with ``collective_rpc``. ``enable_amx`` asks Linux for AMX tile permission
(``arch_prctl(ARCH_REQ_XCOMP_PERM)`` via torch) in the worker process: vLLM's CPU attention
picks its AMX kernel for bfloat16 whenever the CPU has AMX, but never requests the permission,
so the first AMX instruction dies with SIGILL unless some oneDNN call happened to request it
first (measured here: bf16 workers died with exit code -4 in 2 of 4 engine starts).
``model_report`` returns what this worker's loaded model really is, read from the attributes of
vLLM's own layer objects: the attention implementation class of every attention layer and the
vocabulary shard (sizes and ``shard_indices``) of the embedding and the LM head, the LM head
weight's dtype, and the sampling parameters (temperature, top_p, top_k, min_p) of every request
the worker's model runner took in, counted by a probe on where each runner takes them in (V1:
``InputBatch.add_request``; V2, CUDA's default: ``Sampler.add_request``): what the running
engine applied, which ``RequestOutput`` does not carry. A probe that saw nothing is reported
as such; the adapter then reports the values unobservable, never the frontend's.
``logp_install`` puts a catalog ``selected_logprob`` backend into the worker's sampler
(``rollout_logp``), whose report, the dtype and width of the logits the sampler received and
the ``LogitsProcessor``'s ``head_dtype`` are part of ``model_report``. ``weights_begin`` /
``weights_load`` / ``weights_end`` load pushed weights in place (vLLM's layerwise reload, which
re-runs each layer's ``process_weights_after_loading``: on the CPU build the linear weights
are re-packed for oneDNN, which a plain ``model.load_weights`` would not do).
``weights_loaded`` returns this worker's digests of the weights it loaded, per checkpoint
tensor (``runtimes.weights.vllm_layout``), taken at the one point where they exist as plain
tensors on every platform: importing this module (which vLLM does in ``init_worker``, before
it loads the model) wraps the model loader's ``process_weights_after_loading`` so that the
digests are taken after ``load_weights`` and before it (the CPU build packs each linear weight
there and leaves an empty ``layer.weight``); it also wraps the loader's ``initialize_model``, so
that the dtype every parameter was constructed in is read before any weight is loaded (the
side's per-tensor declaration, ``constructed_dtypes``). ``weights_live`` digests the model as
it is now (after a weight update, say), naming every tensor vLLM no longer holds readably.

Knows nothing about cases, knobs, scoring, how the report is summarised, or the engine's
processes; imported only inside vLLM workers, where vLLM and torch are loaded: a process of
their own, or, with the engine core in the caller's process at TP 1 (``uni``), the caller,
which then builds engine after engine (every record starts afresh with each model built,
``_forget_earlier_engines``).
"""

from __future__ import annotations

import os
import weakref
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypedDict

from pytest_logprob_drift.runtimes.vllm import rollout_logp

if TYPE_CHECKING:
    import torch

    from pytest_logprob_drift.registry.session import KernelReference
    from pytest_logprob_drift.runtimes.weights.side_report import RankReport

_VOCAB_LAYERS = ("embed_tokens", "lm_head")

KEEP_MOE_KERNEL_FOR_TESTS = "PYTEST_LOGPROB_DRIFT_TEST_ONLY_KEEP_MOE_KERNEL"
"""Test-only: set to ``1`` in the environment the engine's workers inherit, ``_forget_moe_kernel``
leaves the built kernel in place, so a push runs as vLLM 0.32 alone runs it (scrambled CPU
experts) and the after-reload check (``packed_experts``) must name it. Nothing in the package
sets it."""

LOAD_POINT = (
    "vLLM worker, after load_weights and before process_weights_after_loading (where the CPU "
    "build packs linear weights)"
)
LIVE_POINT = "vLLM worker, the live model when asked"
PUSH_POINT = (
    "vLLM worker, after the trainer's push: each layer as loaded by vLLM's layerwise reload, "
    "before process_weights_after_loading (where the CPU build packs linear weights)"
)


@dataclass
class _LoadDigests:
    """This worker's load-time weight report (``loaded``), or why it could not be taken
    (``error``), and a weak reference to the model it was taken from (``model``); and, read
    once when the model was constructed (before any weight was loaded), the dtype of every
    parameter and buffer vLLM created in a dtype other than the engine's (``constructed``,
    vLLM's names; ``built``: the model they were read from)."""

    model: weakref.ref[Any] | None = None
    loaded: RankReport | None = None
    error: str | None = None
    built: weakref.ref[Any] | None = None
    constructed: dict[str, str] = field(default_factory=dict)


_WEIGHTS = _LoadDigests()


def loaded_model() -> Any:
    """The model this worker process loaded (None before a load, or outside a worker)."""
    ref = _WEIGHTS.model
    return None if ref is None else ref()


def constructed_dtypes(model: Any) -> dict[str, str] | None:
    """What ``model`` was constructed with where it differs from the engine's dtype (vLLM's
    parameter and buffer names -> dtype), read when vLLM built it, before any weight was
    loaded (``_install_construction_record``); None when this worker did not see ``model``
    built (then nothing is declared per tensor)."""
    ref = _WEIGHTS.built
    if ref is None or ref() is not model:
        return None
    return dict(_WEIGHTS.constructed)


def _install_construction_record() -> bool:
    """Wrap (once, in this process) the model loader's ``initialize_model`` so that every model
    this worker builds has the dtype of each parameter and buffer read as vLLM created it,
    before ``load_weights`` runs (``vllm_layout.constructed_dtypes``): the declaration of what
    the engine holds each tensor in, taken from construction, never from what a loader
    later put there. False when vLLM's loader is not importable here."""
    return _wrap_loader("initialize_model", "_drift_construction", _recording_construction)


def _wrap_loader(attribute: str, marker: str, wrapper_of: Any) -> bool:
    """Replace vLLM's ``base_loader.<attribute>`` (once per process: the wrapper carries
    ``marker``) with ``wrapper_of(original)``. False when vLLM's loader is not importable."""
    try:
        from vllm.model_executor.model_loader import base_loader as loader_module
    except ImportError:
        return False
    base_loader: Any = loader_module
    original = getattr(base_loader, attribute)
    if getattr(original, marker, False):
        return True
    wrapper = wrapper_of(original)
    setattr(wrapper, marker, True)
    setattr(base_loader, attribute, wrapper)
    return True


def _recording_construction(original: Any) -> Any:
    """``initialize_model`` that records the built model's constructed dtypes."""

    def initialize_then_record(*args: Any, **kwargs: Any) -> Any:
        from pytest_logprob_drift.runtimes.weights.vllm_layout import (
            constructed_dtypes as read_dtypes,
        )

        _forget_earlier_engines()
        model = original(*args, **kwargs)
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        model_config = kwargs.get("model_config") or getattr(vllm_config, "model_config", None)
        engine_dtype = getattr(model_config, "dtype", None)
        _WEIGHTS.built = weakref.ref(model)
        _WEIGHTS.constructed = read_dtypes(model, engine_dtype)
        return model

    return initialize_then_record


def _forget_earlier_engines() -> None:
    """Start every record of this worker afresh for the engine being built. A worker is a
    process of its own per engine unless vLLM runs it in the caller's process (the engine core
    there, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, and TP 1: the ``uni`` executor), where one
    process builds engine after engine: what an earlier engine's worker loaded, saw, captured
    or was given (a V2 logprob kernel) is never reported as, or run by, this one's."""
    from pytest_logprob_drift.runtimes.vllm import rollout_logp_v2, routing_capture

    for record in (_WEIGHTS, _LAYERS, _PUSHED):
        fresh = type(record)()
        for item in fields(record):
            setattr(record, item.name, getattr(fresh, item.name))
    _SAMPLING_SEEN.clear()
    rollout_logp.forget_logits_seen()
    routing_capture.forget()
    rollout_logp_v2.restore()


def _install_weight_digests() -> bool:
    """Wrap (once, in this process) the model loader's ``process_weights_after_loading`` so
    that every model this worker loads is digested just before it. False when vLLM's loader
    is not importable here (the module is imported outside a worker)."""
    return _wrap_loader("process_weights_after_loading", "_drift_weights", _digesting_load)


def _digesting_load(original: Any) -> Any:
    """``process_weights_after_loading`` that digests the loaded model (and reads the
    prepacked experts back) around the original."""

    def digest_then_process(model: Any, model_config: Any, target_device: Any) -> Any:
        from pathlib import Path

        from pytest_logprob_drift.runtimes.vllm import packed_experts
        from pytest_logprob_drift.runtimes.weights.vllm_layout import rank_report

        _WEIGHTS.model = weakref.ref(model)
        try:
            _WEIGHTS.loaded = rank_report(
                model,
                Path(str(model_config.model)),
                point=LOAD_POINT,
                constructed=constructed_dtypes(model),
            )
            _WEIGHTS.error = None
        except Exception as exc:  # reported, never silently: weights_loaded returns it
            _WEIGHTS.error = f"{type(exc).__name__}: {exc}"
        expected: packed_experts.Expected = {}
        restore = packed_experts.watch(model, expected)
        try:
            out = original(model, model_config, target_device)
        finally:
            restore()
        if _WEIGHTS.loaded is not None and _WEIGHTS.error is None:
            try:
                _WEIGHTS.loaded["packed"] = packed_experts.read_back(model, expected)
            except Exception as exc:  # reported, never silently: weights_loaded returns it
                _WEIGHTS.error = f"{type(exc).__name__}: {exc}"
        return out

    return digest_then_process


_install_construction_record()
_install_weight_digests()

_SAMPLING_SEEN: Counter[tuple[float, float, int, float]] = Counter()
"""``(temperature, top_p, top_k, min_p)`` of every request this worker's input batch took in
(the ``SamplingParams`` the worker really received, after the hop from the frontend), with
how often; never reset while the engine lives (a new engine built in this process starts it
afresh), so a caller compares two reports to see one call's requests."""


def _count(params: Any) -> None:
    """Count one request's sampling parameters in ``_SAMPLING_SEEN``."""
    if params is not None:
        key = (
            float(params.temperature),
            float(params.top_p),
            int(params.top_k),
            float(params.min_p),
        )
        _SAMPLING_SEEN[key] += 1


def _wrap(owner: Any, name: str, params_of: Any) -> None:
    """Wrap ``owner.name`` (once) so that the sampling parameters ``params_of(args)`` finds
    in each call are counted; the call itself is unchanged."""
    original = getattr(owner, name)
    if getattr(original, "_drift_probe", False):
        return

    def probe(self: Any, *args: Any, **kwargs: Any) -> Any:
        _count(params_of(args, kwargs))
        return original(self, *args, **kwargs)

    probe._drift_probe = True  # type: ignore[attr-defined]
    setattr(owner, name, probe)


def _v1_params(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """V1's ``InputBatch.add_request(request)``: the request's ``sampling_params``."""
    request = args[0] if args else kwargs.get("request")
    return getattr(request, "sampling_params", None)


def _v2_params(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """V2's ``Sampler.add_request(req_idx, sampling_params)``."""
    return args[1] if len(args) > 1 else kwargs.get("sampling_params")


def _install_sampling_probe() -> tuple[str, ...]:
    """Wrap, in this worker process (once each), where each model runner takes a request's
    sampling parameters in, so that they are counted in ``_SAMPLING_SEEN``; returns the
    runners probed (``v1``, ``v2``). Model runner V1 (the CPU worker, and CUDA with
    ``VLLM_USE_V2_MODEL_RUNNER=0``): ``vllm.v1.worker.gpu_input_batch.InputBatch.add_request``,
    whose ``request.sampling_params`` feed the sampler and the min_p logits processor. Model
    runner V2 (vLLM 0.32's default on CUDA): ``GPUModelRunner.add_requests`` hands each new
    request's ``sampling_params`` to ``vllm.v1.worker.gpu.sample.sampler.Sampler.add_request``
    (its sampling states, min_p included). Changes nothing the request does."""
    probed: list[str] = []
    try:
        from vllm.v1.worker import gpu_input_batch

        _wrap(gpu_input_batch.InputBatch, "add_request", _v1_params)
        probed.append("v1")
    except ImportError:
        pass
    try:
        from vllm.v1.worker.gpu.sample import sampler as v2_sampler

        _wrap(v2_sampler.Sampler, "add_request", _v2_params)
        probed.append("v2")
    except ImportError:
        pass
    return tuple(probed)


def model_runner(worker: Any) -> str:
    """Which model runner this worker drives: ``v2`` when vLLM chose model runner V2
    (``use_v2_model_runner``; the CPU worker always runs V1), else ``v1``."""
    return "v2" if bool(getattr(worker, "use_v2_model_runner", False)) else "v1"


@dataclass
class _LayerCapture:
    """The layer capture's state in this worker (``layers_arm`` / ``layers_collect``): the
    model hooked (``installed``), whether armed, the armed request's token count and the
    positions kept, and the states seen per state index."""

    armed: bool = False
    installed: Any = None
    tokens: int = 0
    positions: list[int] = field(default_factory=list)
    seen: dict[int, list[torch.Tensor]] = field(default_factory=dict)


_LAYERS = _LayerCapture()


def _install_layer_hooks(model: Any) -> int:
    """Forward hooks (once per worker) on the embeddings, every decoder layer, the final norm
    and the logits processor of a vLLM ``*ForCausalLM``; they record only while armed, and only
    forwards over exactly the armed request's token count. vLLM's decoder layers return
    ``(hidden_states, residual)`` with the residual add fused into the next norm: the residual
    stream after a layer is read as their sum (``hidden_states + residual``, in the model's
    dtype, as transformers adds them inside the layer). The final norm returns
    ``(normed, residual)``: its first element. Returns the number of decoder layers."""
    body = model.model
    layers = list(body.layers)
    if _LAYERS.installed is model:
        return len(layers)

    def hook(index: int, kind: str) -> Any:
        def record(_module: Any, _args: Any, out: Any) -> None:
            if not _LAYERS.armed:
                return
            if kind == "layer":
                state = out[0] + out[1] if isinstance(out, tuple) else out
            else:
                state = out[0] if isinstance(out, tuple) else out
            rows = _LAYERS.tokens - (1 if kind == "logits" else 0)
            if state is None or int(state.shape[0]) != rows:
                return  # another forward (the sampled position's logits, a decode step)
            _LAYERS.seen.setdefault(index, []).append(state.detach())

        return record

    modules = [(body.embed_tokens, "state"), *((m, "layer") for m in layers)]
    modules += [(body.norm, "state"), (model.logits_processor, "logits")]
    for index, (module, kind) in enumerate(modules):
        module.register_forward_hook(hook(index, kind))
    _LAYERS.installed = model
    return len(layers)


@dataclass
class _PushCapture:
    """The last push's tensors as each layer held them once loaded and before its post-load
    processing (``tensors``: module name -> parameter name -> a copy), and the layerwise
    reload's own ``_layerwise_process`` while a push is open (``original``)."""

    tensors: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    original: Any = None
    packed: dict[str, dict[str, str]] = field(default_factory=dict)
    """What each processed MoE layer's prepacked buffers must hold (``packed_experts``)."""
    untouched: dict[str, set[str]] = field(default_factory=dict)
    """Per processed module, the parameters its processing left as they were (same shape,
    dtype and bytes): the live tensor is what the engine computes with, not the copy."""


_PUSHED = _PushCapture()


def _capture_pushed(model: Any) -> None:
    """While a push is open, copy each layer's parameters just before its quantization
    method's ``process_weights_after_loading`` runs (the point where, on the CPU build, a
    linear weight still exists as a plain tensor: processing packs it and empties
    ``layer.weight``), by wrapping the layerwise reload's ``_layerwise_process`` (looked up
    by name when a layer completes, and at finalize). Layers without a quantization method
    (norms) are not processed; their parameters stay readable on the live model."""
    from vllm.model_executor.model_loader.reload import layerwise

    from pytest_logprob_drift.runtimes.vllm import packed_experts

    names = {id(m): n for n, m in model.named_modules()}
    captured: dict[str, dict[str, torch.Tensor]] = {}
    untouched: dict[str, set[str]] = {}
    packed: packed_experts.Expected = {}
    original = layerwise._layerwise_process

    def process(layer: Any, info: Any) -> Any:
        method: Any = getattr(layer, "quant_method", None)
        inner = getattr(method, "process_weights_after_loading", None)
        if inner is None:
            return original(layer, info)

        def snapshot(target: Any) -> Any:
            name = names.get(id(target), type(target).__name__)
            captured[name] = {
                n: p.detach().clone() for n, p in target.named_parameters(recurse=False)
            }
            _forget_moe_kernel(method)
            out = inner(target)
            untouched[name] = {
                n
                for n, before in captured[name].items()
                if _same(target._parameters.get(n), before)
            }
            if all(t in captured[name] for t in packed_experts.TENSORS):
                before = {t: captured[name][t] for t in packed_experts.TENSORS}
                found = packed_experts.expected(method, before)
                if found is not None:
                    packed[name] = found
            return out

        method.process_weights_after_loading = snapshot
        try:
            return original(layer, info)
        finally:
            del method.process_weights_after_loading

    layerwise._layerwise_process = process
    _PUSHED.tensors, _PUSHED.original, _PUSHED.packed = captured, original, packed
    _PUSHED.untouched = untouched


def _same(live: Any, before: torch.Tensor) -> bool:
    """Whether a layer's processing left parameter ``live`` as it was before (``before``)."""
    import torch

    return (
        live is not None
        and live.shape == before.shape
        and live.dtype == before.dtype
        and bool(torch.equal(live.detach(), before))
    )


def _forget_moe_kernel(method: Any) -> None:
    """On vLLM's CPU build, drop an unquantized MoE layer's built kernel before the layer is
    processed again after a push, so that processing runs as at load time (pad, prepack).
    vLLM 0.32's ``UnquantizedFusedMoEMethod.process_weights_after_loading`` runs the CPU
    experts' prepack only while ``moe_kernel`` is None; on a reload it skips it, and the
    layerwise reload then copies the unpacked weights into the packed storage, so the engine
    computes with scrambled experts (measured: docs/MOE.md). The layerwise reload copies the
    processed tensors back into the original storage afterwards, as for a linear."""
    from vllm.platforms import current_platform

    if os.environ.get(KEEP_MOE_KERNEL_FOR_TESTS) == "1":
        return  # test-only: shows the after-reload check catching vLLM's skipped prepack
    if current_platform.is_cpu() and getattr(method, "moe_kernel", None) is not None:
        method.moe_kernel = None


def _release_capture() -> None:
    """Put the layerwise reload's ``_layerwise_process`` back (idempotent)."""
    from vllm.model_executor.model_loader.reload import layerwise

    original, _PUSHED.original = _PUSHED.original, None
    if original is not None:
        layerwise._layerwise_process = original


class PushedTensor(TypedDict):
    """What a push left in one parameter before post-load processing (``weights_pushed``)."""

    shape: list[int]
    dtype: str
    sha256: str


class RankReply(TypedDict):
    """One rank's reply to a reduction request (``layers_collect``, ``routing_collect``): its
    TP rank and size, the SHA-256 of its tensors, and (TP rank 0 only) their wire bytes."""

    tp_rank: int
    tp_size: int
    sha256: str
    reduction: bytes | None


class DriftWorkerExtension:
    """Methods vLLM adds to each worker (called by name through ``collective_rpc``)."""

    def enable_amx(self) -> bool:
        """Called in every worker before any request, as the one per-worker set-up call: the
        sampling probes, then (on the CPU platform only: AMX is a CPU attention matter) AMX
        permission. False on other platforms and where the CPU has no AMX tiles."""
        import torch
        from vllm.platforms import current_platform

        _install_sampling_probe()
        worker: Any = self
        sampler = getattr(getattr(worker, "model_runner", None), "sampler", None)
        if sampler is not None:
            rollout_logp.observe_logits(sampler)
        if not current_platform.is_cpu():
            return False
        if not torch.cpu._is_amx_tile_supported():
            return False
        return bool(torch.cpu._init_amx())

    def weights_loaded(self) -> RankReport:
        """This worker's digests of the weights it loaded (``vllm_layout.rank_report``, taken
        before post-load processing), or ``{"error": ...}`` when none were taken."""
        if _WEIGHTS.loaded is not None:
            return _WEIGHTS.loaded.copy()
        return {"error": _WEIGHTS.error or "the model was loaded before the digest hook"}

    def weights_live(self) -> RankReport:
        """This worker's digests of its model as it is now (collective over the TP group:
        ask every worker at once, as ``collective_rpc`` does)."""
        from pathlib import Path

        from pytest_logprob_drift.runtimes.weights.vllm_layout import rank_report

        worker: Any = self
        model_dir = Path(str(worker.vllm_config.model_config.model))
        model = worker.get_model()
        return rank_report(
            model, model_dir, point=LIVE_POINT, live=True, constructed=constructed_dtypes(model)
        )

    def logp_install(self, spec: KernelReference) -> rollout_logp.LogpReport:
        """Install the catalog ``selected_logprob`` backend ``spec`` names in this worker's
        sampler (``rollout_logp.install``); returns what the worker then runs
        (``rollout_logp.report``, with ``error`` when nothing was installed)."""
        return rollout_logp.install(self, spec)

    def weights_begin(self) -> bool:
        """Open an in-place weight update of this worker's model in checkpoint format, as
        vLLM's own checkpoint-format weight-transfer engines open one (``start_weight_update``:
        ``initialize_layerwise_reload``): each layer's live tensors are kept, the layer is put
        back on the meta device and its weight loaders buffer what arrives until the layer has
        all of it."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        worker: Any = self
        _release_capture()
        with set_current_vllm_config(worker.vllm_config):
            initialize_layerwise_reload(worker.get_model())
        _capture_pushed(worker.get_model())
        return True

    def weights_load(self, payload: bytes) -> list[str]:
        """One chunk of an open update (``tensorio`` wire format, checkpoint names, the
        rollout dtype) through the model's own ``load_weights`` (vLLM's ``update_weights``);
        a layer whose tensors are all in is materialized, loaded and processed at once
        (``process_weights_after_loading``: on the CPU build this re-packs the linear weights
        for oneDNN, so the engine computes with what arrived). Returns the parameter names
        vLLM reports loaded."""
        from vllm.config import set_current_vllm_config

        from pytest_logprob_drift.tensorio import tensors_from_bytes

        worker: Any = self
        tensors = tensors_from_bytes(payload)
        with set_current_vllm_config(worker.vllm_config):
            loaded = worker.get_model().load_weights(iter(tensors.items()))
        return sorted(str(n) for n in (loaded or ()))

    def weights_end(self) -> list[str]:
        """Close the update (vLLM's ``finish_weight_update``: ``finalize_layerwise_reload``):
        layers not fully loaded are processed, the attention layers last, a layer that got
        nothing keeps its previous tensors; then the runner's caches derived from weights are
        dropped, as ``GPUModelRunner.reload_weights`` drops them. Returns the names of the
        parameters the model holds (vLLM's layout), for the caller to name any the push did
        not load."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        worker: Any = self
        runner = worker.model_runner
        try:
            with set_current_vllm_config(worker.vllm_config):
                finalize_layerwise_reload(  # type: ignore[no-untyped-call]
                    worker.get_model(), worker.vllm_config.model_config
                )
        finally:
            _release_capture()
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
            method = getattr(runner, reset, None)
            if callable(method):
                method()
        return sorted(name for name, _ in worker.get_model().named_parameters())

    def weights_after_push(self) -> RankReport:
        """This worker's digests of the weights the last push left it
        (``vllm_layout.rank_report``, collective over the TP group): every layer the push
        processed is read with the tensors it held just before ``process_weights_after_loading``
        (``_capture_pushed``: where the CPU build still has its linear weights as tensors),
        swapped in for the duration, except the parameters that processing left as they were
        (a router's ``e_score_correction_bias``, which vLLM's GLM4-MoE shares between the gate and
        the experts: the copy taken before the gate's processing can predate the pushed value,
        docs/MOE.md); every other tensor as the live model holds it (a layer the
        push never reached shows what it held before: vLLM's dummy weights, for a tensor left
        out). ``{"error": ...}`` before any push."""
        from pathlib import Path

        import torch

        from pytest_logprob_drift.runtimes.vllm import packed_experts
        from pytest_logprob_drift.runtimes.weights.vllm_layout import rank_report

        captured = dict(_PUSHED.tensors)
        if not captured:
            return {"error": "no push has run in this worker"}
        worker: Any = self
        model = worker.get_model()
        packed = packed_experts.read_back(model, _PUSHED.packed)  # live, after the reload
        # By parameter identity, so that a parameter two modules share (a tied LM head) is
        # swapped in both and stays tied in the view.
        replacement: dict[int, Any] = {}
        for module_name, params in captured.items():
            module = model.get_submodule(module_name)
            for name, tensor in params.items():
                if name in _PUSHED.untouched.get(module_name, ()):
                    continue  # processing leaves it as is: the live tensor is what runs
                held = module._parameters[name]
                replacement[id(held)] = torch.nn.Parameter(tensor, requires_grad=False)
        swapped: list[tuple[Any, str, Any]] = []
        try:
            for module in model.modules():
                for name, held in list(module._parameters.items()):
                    if held is not None and id(held) in replacement:
                        swapped.append((module, name, held))
                        module._parameters[name] = replacement[id(held)]
            model_dir = Path(str(worker.vllm_config.model_config.model))
            report = rank_report(
                model, model_dir, point=PUSH_POINT, constructed=constructed_dtypes(model)
            )
            return {**report, "packed": packed}
        finally:
            for module, name, original in reversed(swapped):
                module._parameters[name] = original

    def weights_pushed(self) -> dict[str, dict[str, PushedTensor]]:
        """What the last push left in each processed layer just before its post-load
        processing (``_capture_pushed``): module name -> parameter name -> shape, dtype and
        the SHA-256 of its bytes. Empty before any push."""
        import hashlib

        import torch

        out: dict[str, dict[str, PushedTensor]] = {}
        for module, params in dict(_PUSHED.tensors).items():
            out[module] = {
                name: {
                    "shape": [int(d) for d in tensor.shape],
                    "dtype": str(tensor.dtype).removeprefix("torch."),
                    "sha256": hashlib.sha256(
                        tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                    ).hexdigest(),
                }
                for name, tensor in params.items()
            }
        return out

    def layers_arm(self, tokens: int, positions: list[int]) -> int:
        """Arm the layer hooks for the next request of ``tokens`` prompt tokens: states at
        ``positions`` (the ones that score the active tokens) are kept. Returns the decoder
        layer count."""
        worker: Any = self
        count = _install_layer_hooks(worker.get_model())
        _LAYERS.armed, _LAYERS.tokens = True, int(tokens)
        _LAYERS.positions, _LAYERS.seen = list(positions), {}
        return count

    def layers_collect(self) -> RankReply:
        """Disarm; the reduction (``numerics.layer_reduction.reduce_states``) of each state at
        the armed positions, in state order (embeddings, layers, final norm, logits), as the
        project's tensor wire format (``tensorio``: ``{k}.digests``, ``{k}.projections``,
        ``{k}.norms``). Every rank reduces its own states and returns its tensor-parallel
        rank and size and the SHA-256 of its reduction (``reduction_sha256``); only TP rank 0
        puts the reduction's bytes in its reply (``reduction``; None on the other ranks), so
        only rank 0's reduction crosses processes at full size (``runtimes.vllm.layer_ranks``
        checks the ranks agree). A state not seen exactly once is a RuntimeError."""
        import torch
        from vllm.distributed.parallel_state import (
            get_tensor_model_parallel_rank,
            get_tensor_model_parallel_world_size,
        )

        from pytest_logprob_drift.numerics.layer_reduction import reduce_states, reduction_sha256
        from pytest_logprob_drift.runtimes.vllm.layer_ranks import READ_RANK
        from pytest_logprob_drift.tensorio import tensor_bytes

        _LAYERS.armed = False
        seen, _LAYERS.seen = _LAYERS.seen, {}
        expected = len(list(_LAYERS.installed.model.layers)) + 3
        out: dict[str, torch.Tensor] = {}
        for index in range(expected):
            states = seen.get(index, [])
            if len(states) != 1:
                raise RuntimeError(
                    f"state {index} was recorded {len(states)} times for one request "
                    "(the forward did not run once over the whole prompt)"
                )
            picked = states[0][torch.tensor(_LAYERS.positions, dtype=torch.long)]
            digests, projections, norms = reduce_states(picked)
            out[f"{index}.digests"] = digests
            out[f"{index}.projections"] = projections
            out[f"{index}.norms"] = norms
        rank = int(get_tensor_model_parallel_rank())
        return {
            "tp_rank": rank,
            "tp_size": int(get_tensor_model_parallel_world_size()),
            "sha256": reduction_sha256(out),
            "reduction": tensor_bytes(out) if rank == READ_RANK else None,
        }

    def routing_arm(self) -> int:
        """Arm the routing capture (``routing_capture``) for the next generation; the MoE
        layer count (0: the model has none, nothing is recorded)."""
        from pytest_logprob_drift.runtimes.vllm import routing_capture

        worker: Any = self
        count = routing_capture.install(worker.get_model(), worker.model_runner)
        routing_capture.arm()
        return count

    def routing_collect(self) -> RankReply:
        """Disarm; this worker's routing (``routing_capture.collect``) as a rank reply: every
        rank sends its TP rank and size and the SHA-256 of its tensors, only TP rank 0 the
        tensors themselves (``layer_ranks.rank_zero_reduction`` checks the ranks agree)."""
        from vllm.distributed.parallel_state import (
            get_tensor_model_parallel_rank,
            get_tensor_model_parallel_world_size,
        )

        from pytest_logprob_drift.numerics.layer_reduction import reduction_sha256
        from pytest_logprob_drift.runtimes.vllm import routing_capture
        from pytest_logprob_drift.runtimes.vllm.layer_ranks import READ_RANK
        from pytest_logprob_drift.tensorio import tensor_bytes

        out = routing_capture.collect()
        rank = int(get_tensor_model_parallel_rank())
        return {
            "tp_rank": rank,
            "tp_size": int(get_tensor_model_parallel_world_size()),
            "sha256": reduction_sha256(out),
            "reduction": tensor_bytes(out) if rank == READ_RANK else None,
        }

    def model_report(self) -> dict[str, Any]:
        """This worker's attention implementations and vocabulary shards (plain values only).

        ``attention_backends``: sorted class names of ``layer.impl`` over the model's attention
        layers (``AttentionLayerBase``). ``vocab``: for the first ``VocabParallelEmbedding``
        named ``embed_tokens`` and the first named ``lm_head``, the layer's tensor-parallel
        rank and size, its original and padded vocabulary sizes, its rows per rank and its
        ``shard_indices`` (the padded rows and the real token ids this rank owns).
        ``lm_head_dtype``: the dtype of the loaded LM head's weight (``none`` without one).
        ``sampling_seen``: the sampling parameters of the requests this worker's input batch
        took in so far (``_install_sampling_probe``), with their counts.
        """
        from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

        worker: Any = self  # the vLLM worker this class is mixed into
        model = worker.get_model()
        backends: set[str] = set()
        layers: dict[str, str] = {}
        vocab: dict[str, dict[str, int]] = {}
        for name, module in model.named_modules():
            if isinstance(module, AttentionLayerBase):
                impl = getattr(module, "impl", None)
                if impl is not None:
                    backends.add(type(impl).__name__)
                    layers[name] = type(impl).__name__
            leaf = name.rsplit(".", 1)[-1]
            if leaf in _VOCAB_LAYERS and leaf not in vocab:
                if isinstance(module, VocabParallelEmbedding):
                    shard = module.shard_indices
                    vocab[leaf] = {
                        "tp_rank": int(module.tp_rank),
                        "tp_size": int(module.tp_size),
                        "org_vocab_size": int(module.org_vocab_size),
                        "num_embeddings_padded": int(module.num_embeddings_padded),
                        "num_embeddings_per_partition": int(module.num_embeddings_per_partition),
                        "padded_org_vocab_start_index": int(shard.padded_org_vocab_start_index),
                        "padded_org_vocab_end_index": int(shard.padded_org_vocab_end_index),
                        "org_vocab_start_index": int(shard.org_vocab_start_index),
                        "org_vocab_end_index": int(shard.org_vocab_end_index),
                    }
        head = next(
            (m for n, m in model.named_modules() if n.rsplit(".", 1)[-1] == "lm_head"), None
        )
        weight = getattr(head, "weight", None)
        head_dtype = str(weight.dtype).removeprefix("torch.") if weight is not None else "none"
        probed = _install_sampling_probe()
        processor = getattr(model, "logits_processor", None)
        compute = getattr(processor, "head_dtype", None)
        return {
            "extension_file": __file__,
            "logp": rollout_logp.report(worker),
            "lm_head_compute_dtype": (
                str(compute).removeprefix("torch.") if compute is not None else "model"
            ),
            **rollout_logp.logits_seen(),
            "sampling_probe": model_runner(worker) in probed,
            "model_runner": model_runner(worker),
            "sampling_probes": list(probed),
            "sampling_seen": [
                {"temperature": t, "top_p": p, "top_k": k, "min_p": m, "requests": n}
                for (t, p, k, m), n in sorted(_SAMPLING_SEEN.items())
            ],
            "attention_backends": sorted(backends),
            "attention_layers": layers,
            "vocab": vocab,
            "lm_head_dtype": head_dtype,
        }
