"""The rollout side's routing capture inside a vLLM worker: the experts each MoE layer chose
for each token while the engine generated.

Owns, in one vLLM worker process (model runner V1, eager: vLLM 0.32's CPU build), wrapping
each MoE layer's ``MoERunner.router.select_experts`` (the Python call the modular CPU experts
make before the fused kernel, returning float32 weights and int32 ids; keyed by the runner's
``layer_id``, numbered 0.. in layer order) and a forward pre-hook on the model that snapshots,
for every forward while armed, the step's flattened tokens (``input_ids``, ``positions``) and
which request each belongs to (the model runner's ``input_batch.req_ids`` and
``query_start_loc``). ``collect`` joins them into, per request (vLLM's internal request id),
the positions it routed, the token at each, and each MoE layer's top-k ids (ascending) and
weights (same order): the tensors the engine maps to rows by their tokens. Nothing is replayed:
a prompt token the prefix cache served is never routed and so never recorded.

Knows nothing about cases, rows or files; imported only inside vLLM worker processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass
class _Step:
    """One forward while armed: its flattened tokens and positions, the requests it served
    (``req_ids``, their token offsets ``query_start_loc``) and, per MoE layer index, each
    router call's ``(ids, weights)``."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    req_ids: list[str]
    query_start_loc: list[int]
    layers: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)


@dataclass
class _Capture:
    """The capture's state in this worker: ``installed`` (the model wrapped), ``layers`` (MoE
    layer count), ``armed``, ``steps`` (one record per forward while armed)."""

    armed: bool = False
    installed: Any = None
    layers: int = 0
    steps: list[_Step] = field(default_factory=list)


_STATE = _Capture()


def _moe_runners(model: Any) -> list[Any]:
    """Every MoE layer's runner (a module with a ``router`` that selects experts and a
    ``layer_id``), in layer order."""
    found = []
    for _name, module in model.named_modules():
        router = getattr(module, "router", None)
        if router is not None and hasattr(router, "select_experts") and hasattr(module, "layer_id"):
            found.append(module)
    return sorted(found, key=lambda m: int(m.layer_id))


def install(model: Any, runner: Any) -> int:
    """Wrap every MoE layer's router and hook the model (once per worker); the MoE layer
    count (0: no MoE layer, nothing wrapped)."""
    if _STATE.installed is model:
        return _STATE.layers
    runners = _moe_runners(model)
    for index, moe in enumerate(runners):
        original = moe.router.select_experts

        def select(*args: Any, _original: Any = original, _index: int = index, **kw: Any) -> Any:
            weights, ids = _original(*args, **kw)
            if _STATE.armed and _STATE.steps:
                _STATE.steps[-1].layers.setdefault(_index, []).append(
                    (ids.detach().to("cpu", copy=True), weights.detach().float().to("cpu"))
                )
            return weights, ids

        moe.router.select_experts = select

    def snapshot(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        if not _STATE.armed:
            return
        batch = runner.input_batch
        count = int(batch.num_reqs)
        _STATE.steps.append(
            _Step(
                input_ids=kwargs["input_ids"].detach().to("cpu", copy=True),
                positions=kwargs["positions"].detach().to("cpu", copy=True),
                req_ids=list(batch.req_ids[:count]),
                query_start_loc=[int(n) for n in runner.query_start_loc.np[: count + 1]],
            )
        )

    model.register_forward_pre_hook(snapshot, with_kwargs=True)
    _STATE.installed, _STATE.layers = model, len(runners)
    return len(runners)


def forget() -> None:
    """Drop the capture of an earlier model (a new engine built in this process): the next
    ``install`` wraps the new model's routers."""
    _STATE.armed, _STATE.installed, _STATE.layers, _STATE.steps = False, None, 0, []


def arm() -> None:
    _STATE.armed, _STATE.steps = True, []


def collect() -> dict[str, torch.Tensor]:
    """Disarm; per request (numbered ``n`` in the order of vLLM's internal request ids),
    ``{n}.positions`` int64 ``[P]``, ``{n}.tokens`` int64 ``[P]``, ``{n}.expert_ids`` int64
    ``[P, layers, k]`` (ascending per token) and ``{n}.gate_weights`` float32 (same order),
    positions ascending. A forward in which a MoE
    layer's router ran other than once, or a position routed twice, is a RuntimeError."""
    import torch

    _STATE.armed = False
    steps, _STATE.steps = _STATE.steps, []
    layers = _STATE.layers
    if layers == 0:  # a dense model: nothing was routed
        return {}
    per_request: dict[str, dict[int, tuple[int, torch.Tensor, torch.Tensor]]] = {}
    for number, step in enumerate(steps):
        starts = step.query_start_loc
        total = starts[-1]
        if total == 0:
            continue
        calls = step.layers
        if sorted(calls) != list(range(layers)) or any(len(c) != 1 for c in calls.values()):
            raise RuntimeError(
                f"forward {number}: the MoE routers ran {[len(c) for c in calls.values()]} times "
                f"over {layers} layers, not once each"
            )
        ids = torch.stack([calls[i][0][0][:total].long() for i in range(layers)], dim=1)
        weights = torch.stack([calls[i][0][1][:total] for i in range(layers)], dim=1)
        order = ids.argsort(dim=-1)
        ids, weights = ids.gather(-1, order), weights.gather(-1, order)
        for slot, req_id in enumerate(step.req_ids):
            seen = per_request.setdefault(str(req_id), {})
            for j in range(starts[slot], starts[slot + 1]):
                position = int(step.positions[j])
                if position in seen:
                    raise RuntimeError(f"request {req_id}: position {position} routed twice")
                seen[position] = (int(step.input_ids[j]), ids[j], weights[j])
    out: dict[str, torch.Tensor] = {}
    for n, req_id in enumerate(sorted(per_request)):
        seen = per_request[req_id]
        positions = sorted(seen)
        out[f"{n}.positions"] = torch.tensor(positions, dtype=torch.int64)
        out[f"{n}.tokens"] = torch.tensor([seen[p][0] for p in positions], dtype=torch.int64)
        out[f"{n}.expert_ids"] = torch.stack([seen[p][1] for p in positions])
        out[f"{n}.gate_weights"] = torch.stack([seen[p][2] for p in positions]).float()
    return out
