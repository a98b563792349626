"""The CPU build's prepacked MoE expert buffers read back against the prepack of what was loaded.

Owns the check after the reload: vLLM's CPU build pads each rank's expert intermediate to a
multiple of 32 and prepacks ``w13_weight`` / ``w2_weight`` in place after loading
(``experts/cpu_moe.py``, ``CPUUnquantizedExperts.process_weights_after_loading``: same shape,
permuted bytes), so the weight digests, taken before that, cannot see what the kernel reads.
``watch`` wraps each MoE layer's processing so that, once it ran, the same experts object's
own ``process_weights_after_loading`` is applied to a copy of the tensors the layer held just
before (``expected``: deterministic, measured: the prepack writes every output byte);
``read_back`` then digests what each layer holds and pairs it with that expectation. Nothing
is recorded for a layer whose experts are not the CPU build's unquantized ones (CUDA, zentorch,
quantized experts): there the held tensors are the loaded ones or another format. Imported only
inside vLLM worker processes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from pytest_logprob_drift.runtimes.weights.side_report import RankPacked

TENSORS = ("w13_weight", "w2_weight")
"""The expert tensors the CPU build prepacks, in the layer's names."""

Expected = dict[str, dict[str, str]]
"""Layer name -> tensor name -> SHA-256 of what the layer must hold after processing."""


def _sha(tensor: Any) -> str:
    import torch

    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(data.numpy().tobytes()).hexdigest()


def _cpu_experts(method: Any) -> Any:
    """The layer's CPU unquantized experts object once its kernel is built (None otherwise,
    or when it chose zentorch, which keeps the weights as loaded)."""
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:
        return None
    experts = getattr(getattr(method, "moe_kernel", None), "fused_experts", None)
    if not isinstance(experts, CPUUnquantizedExperts) or getattr(experts, "_use_zentorch", False):
        return None
    return experts


def expected(method: Any, before: dict[str, Any]) -> dict[str, str] | None:
    """The digests of what vLLM's own processing makes of ``before`` (the layer's expert
    tensors as loaded, copies): the layer's experts object processes a stand-in module holding
    copies of them (pad, then prepack); None when the layer's experts are not the CPU build's."""
    import torch

    experts = _cpu_experts(method)
    if experts is None:
        return None
    standin = torch.nn.Module()
    for name, tensor in before.items():
        standin.register_parameter(name, torch.nn.Parameter(tensor.clone(), requires_grad=False))
    chose = getattr(experts, "_use_zentorch", False)
    try:
        experts.process_weights_after_loading(standin)
    finally:
        experts._use_zentorch = chose  # the stand-in must not change the layer's choice
    return {name: _sha(getattr(standin, name)) for name in TENSORS}


def moe_layers(model: Any) -> dict[str, Any]:
    """Every module of ``model`` that owns fused expert parameters (``w13_weight`` and
    ``w2_weight`` among its own) and a quantization method, one per method object."""
    found: dict[str, Any] = {}
    methods: set[int] = set()
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        own = getattr(module, "_parameters", {})
        if method is None or id(method) in methods or not all(t in own for t in TENSORS):
            continue
        methods.add(id(method))
        found[name] = module
    return found


def watch(model: Any, sink: Expected) -> Callable[[], None]:
    """Wrap each MoE layer's ``quant_method.process_weights_after_loading`` so that after it
    runs, ``sink[layer]`` holds ``expected`` of the tensors the layer held just before; returns
    the function that takes the wraps off."""
    wrapped: list[Any] = []
    for name, layer in moe_layers(model).items():
        method = layer.quant_method
        inner = method.process_weights_after_loading

        def checked(target: Any, *, _name: str = name, _m: Any = method, _i: Any = inner) -> Any:
            before = {t: getattr(target, t).detach().clone() for t in TENSORS}
            out = _i(target)
            found = expected(_m, before)
            if found is not None:
                sink[_name] = found
            return out

        method.process_weights_after_loading = checked
        wrapped.append(method)

    def restore() -> None:
        for method in wrapped:
            del method.process_weights_after_loading

    return restore


def read_back(model: Any, wanted: Expected) -> list[RankPacked]:
    """Each expected layer's held expert tensors digested now, beside what they must be."""
    out: list[RankPacked] = []
    for layer, tensors in sorted(wanted.items()):
        module = model.get_submodule(layer)
        for tensor, digest in sorted(tensors.items()):
            out.append(
                {
                    "layer": layer,
                    "tensor": tensor,
                    "expected": digest,
                    "held": _sha(getattr(module, tensor)),
                }
            )
    return out
