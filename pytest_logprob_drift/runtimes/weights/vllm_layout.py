"""vLLM's weight layout mapped back to the checkpoint's names, per tensor-parallel rank.

Owns, inside one vLLM worker, finding where each checkpoint tensor sits in the loaded model
and digesting it there: each checkpoint name goes through the model class's own
``hf_to_vllm_mapper`` (vLLM 0.32: ``WeightsMapper._map_name_with_shard``, the very mapping its
loader applies, stacked shards included) or, without one, its ``packed_modules_mapping``; the
shard's rows within the fused parameter come from the layer's own sizes (``QKVParallelLinear``:
heads x head size of q, k, v on this rank, with replicated KV heads; ``MergedColumnParallelLinear``:
``output_sizes`` / TP), and the rank's span of the checkpoint tensor from the layer's TP rank
(column-parallel rows, row-parallel columns, the vocabulary rows ``shard_indices`` names, with
the padding rows left out). Every rank digests its own span (a per-rank slice digest); the
spans are gathered to TP rank 0 over the TP group's CPU (gloo) group and rank 0 digests the
whole tensor in the checkpoint's layout. A vLLM parameter no checkpoint name reaches is
reported tied (the same parameter object as a mapped one: a tied LM head) or as held without
a checkpoint source. Quantized layers are refused by name; a mixture-of-experts model's
per-expert checkpoint tensors are placed in vLLM's fused ``w13``/``w2`` by the layer's own
expert mapping (``moe_experts.expert_places``: one expert of the fused parameter, gate and up
apart, this rank's rows or columns), and its router checked like any replicated linear. The pure
arithmetic (``split_rows``, ``qkv_rows``, ``merged_rows``, ``vocab_rows``) takes plain numbers
so it is tested without an engine.

Knows nothing about cases, comparison or how the report is sealed; runs only where vLLM and
torch are loaded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import torch

from pytest_logprob_drift.runtimes.weights.digest import dtype_name, slice_of, tensor_sha256
from pytest_logprob_drift.runtimes.weights.moe_experts import (
    FUSED_ON_BOTH,
    expert_places,
    is_expert_tensor,
)
from pytest_logprob_drift.runtimes.weights.side_report import (
    HeldPacked,
    HeldSlice,
    HeldTensor,
    RankReport,
    RankTensor,
    SideReport,
)

QKV_SHARDS = ("q", "k", "v")


@dataclass(frozen=True, slots=True, kw_only=True)
class RankSpan:
    """Where one checkpoint tensor sits on one rank: rows ``[local_start, local_stop)`` of
    the vLLM parameter (``local_dim``) hold rows or columns ``[start, stop)`` (``dim``) of the
    checkpoint tensor; ``dim`` None: the rank holds the whole tensor (replicated)."""

    local_dim: int
    local_start: int
    local_stop: int
    dim: int | None
    start: int
    stop: int


def merged_rows(output_sizes: Sequence[int], tp_size: int, tp_rank: int, shard: int) -> RankSpan:
    """A ``MergedColumnParallelLinear`` shard: its rows on this rank and its span of the
    checkpoint tensor (every shard split evenly over the TP ranks)."""
    return _fused_rows([int(n) // tp_size for n in output_sizes], shard, tp_rank)


def _fused_rows(sizes: Sequence[int], index: int, block: int) -> RankSpan:
    """Shard ``index`` of a fused parameter whose shards hold ``sizes`` rows on this rank, in
    order: its rows there, and block ``block`` of its checkpoint tensor's rows."""
    offset = sum(sizes[:index])
    size = sizes[index]
    return RankSpan(
        local_dim=0,
        local_start=offset,
        local_stop=offset + size,
        dim=0,
        start=block * size,
        stop=(block + 1) * size,
    )


def qkv_rows(
    *,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    v_head_size: int,
    num_kv_head_replicas: int,
    tp_rank: int,
    shard: str,
) -> RankSpan:
    """A ``QKVParallelLinear`` shard (``q``, ``k`` or ``v``) on this rank: its rows in the fused
    parameter (heads x head size of each shard, in q, k, v order) and its span of the
    checkpoint's ``q_proj``/``k_proj``/``v_proj`` (q heads split over ranks; KV heads split,
    or replicated ``num_kv_head_replicas`` times when TP exceeds their count). Head counts
    are this rank's (vLLM's ``num_heads`` and ``num_kv_heads``)."""
    sizes = {
        "q": num_heads * head_size,
        "k": num_kv_heads * head_size,
        "v": num_kv_heads * v_head_size,
    }
    block = tp_rank if shard == "q" else tp_rank // num_kv_head_replicas
    return _fused_rows([sizes[s] for s in QKV_SHARDS], list(QKV_SHARDS).index(shard), block)


def split_rows(local: int, dim: int, tp_rank: int) -> RankSpan:
    """An evenly split parameter (column-parallel rows, row-parallel columns): the whole local
    parameter is span ``tp_rank`` of ``local`` along ``dim``."""
    return RankSpan(
        local_dim=dim,
        local_start=0,
        local_stop=local,
        dim=dim,
        start=tp_rank * local,
        stop=(tp_rank + 1) * local,
    )


def vocab_rows(org_vocab_start: int, org_vocab_end: int) -> RankSpan:
    """A vocabulary-parallel embedding or LM head: this rank's first ``end - start`` rows hold
    the checkpoint's rows ``[start, end)``; the rows after them are padding, left out."""
    return RankSpan(
        local_dim=0,
        local_start=0,
        local_stop=org_vocab_end - org_vocab_start,
        dim=0,
        start=org_vocab_start,
        stop=org_vocab_end,
    )


def whole(rows: int) -> RankSpan:
    """A replicated parameter: this rank holds the whole tensor."""
    return RankSpan(local_dim=0, local_start=0, local_stop=rows, dim=None, start=0, stop=rows)


class LayoutRefused(Exception):
    """The model holds a layout this mapping does not cover (quantized, pipeline stages): the
    reason."""


def _refusal(model: Any) -> str | None:
    """Why the mapping cannot cover ``model`` (None: it can)."""
    from vllm.distributed.parallel_state import get_pp_group

    if get_pp_group().world_size > 1:
        return "pipeline parallelism: the layers are spread over stages"
    for name, module in model.named_modules():
        if is_expert_tensor(name + "."):  # fused MoE experts: skipped by name (moe_experts)
            continue
        method = getattr(module, "quant_method", None)
        if method is not None and not type(method).__name__.startswith("Unquantized"):
            return f"{name} is quantized ({type(method).__name__})"
        if int(getattr(module, "num_added_embeddings", 0) or 0) > 0:
            return f"{name} has added (LoRA) vocabulary rows"
    for name, param in model.named_parameters():
        if param.ndim >= 3 and not is_expert_tensor(name):
            return (
                f"{name} is a {param.ndim}-D parameter {list(param.shape)} (fused experts or a "
                "convolution: the mapping covers dense 1-D and 2-D weights only)"
            )
    return None


def _mapped(model: Any, name: str) -> tuple[str, Any] | None:
    """The vLLM parameter name and shard id a checkpoint name loads into, as the model class
    maps it (None: the mapper drops the name)."""
    mapper = getattr(type(model), "hf_to_vllm_mapper", None)
    if mapper is not None and hasattr(mapper, "_map_name_with_shard"):
        result = mapper._map_name_with_shard(name)
        if result is None:
            return None
        target, shard = result
        if shard is not None or target != name:
            return str(target), shard
    packed: Mapping[str, list[str]] = getattr(type(model), "packed_modules_mapping", {}) or {}
    for fused, parts in packed.items():
        for index, part in enumerate(parts):
            token = f".{part}."
            if token in name:
                return name.replace(token, f".{fused}."), index
    return name, None


def _span(module: Any, leaf: str, shard: Any, rows: int) -> RankSpan:
    """Where the checkpoint tensor sits in ``module``'s parameter ``leaf`` on this rank."""
    from vllm.model_executor.layers.linear import (
        ColumnParallelLinear,
        MergedColumnParallelLinear,
        QKVParallelLinear,
        RowParallelLinear,
    )
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    if isinstance(module, QKVParallelLinear):
        letter = shard if isinstance(shard, str) else QKV_SHARDS[int(shard)]
        return qkv_rows(
            num_heads=int(module.num_heads),
            num_kv_heads=int(module.num_kv_heads),
            head_size=int(module.head_size),
            v_head_size=int(getattr(module, "v_head_size", module.head_size)),
            num_kv_head_replicas=int(module.num_kv_head_replicas),
            tp_rank=int(module.tp_rank),
            shard=letter,
        )
    if isinstance(module, MergedColumnParallelLinear):
        return merged_rows(
            [int(n) for n in module.output_sizes],
            int(module.tp_size),
            int(module.tp_rank),
            int(shard),
        )
    if isinstance(module, ColumnParallelLinear):
        return split_rows(int(module.output_size_per_partition), 0, int(module.tp_rank))
    if isinstance(module, RowParallelLinear):
        if leaf == "bias":
            return whole(rows)
        return split_rows(int(module.input_size_per_partition), 1, int(module.tp_rank))
    if isinstance(module, VocabParallelEmbedding):
        shard_indices = module.shard_indices
        return vocab_rows(
            int(shard_indices.org_vocab_start_index), int(shard_indices.org_vocab_end_index)
        )
    return whole(rows)


@dataclass(slots=True, kw_only=True)
class _Placed:
    name: str
    vllm_name: str
    param: Any
    span: RankSpan
    expert: int | None = None
    """The expert of a fused expert parameter (``param[expert]`` holds the tensor)."""


def _checkpoint_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    from pytest_logprob_drift.runtimes.weights.checkpoint import safetensors_files

    shapes: dict[str, tuple[int, ...]] = {}
    for path in safetensors_files(model_dir):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                shapes[name] = tuple(int(n) for n in handle.get_slice(name).get_shape())
    return shapes


def _is_packed_away(module: Any, param: Any) -> bool:
    """vLLM's CPU GEMM dispatch replaced this linear's weight by an empty tensor after loading
    (``dispatch_cpu_unquantized_gemm(remove_weight=True)``): the weights live in a packed
    kernel handle that cannot be read back."""
    return int(param.numel()) == 0 and hasattr(module, "cpu_linear")


def constructed_dtypes(model: torch.nn.Module, engine_dtype: Any) -> dict[str, str]:
    """Every floating parameter and buffer of ``model`` (vLLM's names, shared ones under each
    name) whose dtype is not ``engine_dtype`` (a ``torch.dtype``; None: every floating one),
    as ``dtype_name``: read when vLLM has constructed the model and before it loads any weight
    (``worker_ext``), this is the dtype each tensor was created in (vLLM's GLM4-MoE router:
    ``GateLinear(params_dtype=torch.float32)`` and its float32 ``e_score_correction_bias``),
    not what a loader later put there."""
    out: dict[str, str] = {}
    named = [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]
    for name, tensor in named:
        dtype = tensor.dtype
        if dtype.is_floating_point and dtype != engine_dtype:
            out[name] = dtype_name(dtype)
    return out


def rank_report(
    model: Any,
    model_dir: Path,
    *,
    point: str,
    live: bool = False,
    constructed: Mapping[str, str] | None = None,
) -> RankReport:
    """This rank's digests of ``model`` in the checkpoint's names (collective over the TP group:
    every rank of the engine must call it at the same moment).

    Returns plain values: ``tp_rank``, ``tp_size``, ``point``, ``dtype`` (the model's),
    ``tensors`` (per checkpoint name: ``shape``/``dtype`` as held, the whole tensor's
    ``sha256`` on TP rank 0 only, and this rank's ``slice``: dim, start, stop, sha256),
    ``tied`` (vLLM parameter name -> checkpoint name it shares), ``skipped`` and ``extra``
    (name -> reason), ``refused`` (None, or why the layout is not covered), ``seconds`` (what
    taking them cost this rank). ``live``: the model is read as it runs (after post-load
    processing), where a built MoE kernel's experts are not readable (``moe_experts``).
    ``constructed`` (``constructed_dtypes``, taken when the model was built: vLLM name ->
    dtype, where not the engine's): ``declared`` maps each checkpoint name held in such a
    parameter to that dtype, the side's per-tensor declaration; the held ``dtype`` is read
    from the tensor digested, so a loader that changed a parameter's dtype still shows."""
    import time

    from vllm.distributed.parallel_state import get_tp_group

    started = time.perf_counter()
    group = get_tp_group()
    rank, size = int(group.rank_in_group), int(group.world_size)
    params = dict(model.named_parameters(remove_duplicate=False))
    base: RankReport = {
        "tp_rank": rank,
        "tp_size": size,
        "point": point,
        "dtype": dtype_name(next(iter(params.values())).dtype) if params else "none",
    }
    refused = _refusal(model)
    if refused is not None:
        return {**base, "tensors": {}, "tied": {}, "skipped": {}, "extra": {}, "refused": refused}
    tensors: dict[str, RankTensor] = {}
    skipped: dict[str, str] = {}
    placed: list[_Placed] = []
    shapes = _checkpoint_shapes(model_dir)
    experts, not_placed = expert_places(model, shapes, live=live)
    skipped.update(not_placed)
    for name in sorted(shapes):
        if name in experts:
            where = experts[name]
            span = RankSpan(
                local_dim=where.span.local_dim,
                local_start=where.span.local_start,
                local_stop=where.span.local_stop,
                dim=where.span.dim,
                start=where.span.start,
                stop=where.span.stop,
            )
            placed.append(
                _Placed(
                    name=name,
                    vllm_name=where.param_name,
                    param=params[where.param_name],
                    span=span,
                    expert=where.span.expert,
                )
            )
            continue
        if name in not_placed:
            continue
        mapped = _mapped(model, name)
        if mapped is None:
            skipped[name] = "the model class's hf_to_vllm_mapper drops this checkpoint name"
            continue
        vllm_name, shard = mapped
        param = params.get(vllm_name)
        if param is None:
            if name.endswith("rotary_emb.inv_freq"):
                skipped[name] = "rotary inverse frequencies: vLLM recomputes them, holds none"
            else:
                tensors[name] = {"held": False, "vllm_name": vllm_name}
            continue
        module_name, _, leaf = vllm_name.rpartition(".")
        module = model.get_submodule(module_name)
        if _is_packed_away(module, param):
            skipped[name] = (
                f"{vllm_name} was packed by vLLM's CPU GEMM dispatch after loading (the "
                "parameter is now an empty tensor); read only at load time"
            )
            continue
        span = _span(module, leaf, shard, shapes[name][0] if shapes[name] else 0)
        placed.append(_Placed(name=name, vllm_name=vllm_name, param=param, span=span))
    for item in placed:
        tensors[item.name] = _digest_placed(item, group, rank, size)
    built = constructed or {}
    declared = {p.name: built[p.vllm_name] for p in placed if p.vllm_name in built}
    covered = {id(p.param) for p in placed}
    by_object = {id(p.param): p.name for p in placed}
    mapped_names = {p.vllm_name for p in placed}
    tied: dict[str, str] = {}
    extra: dict[str, str] = {}
    for vllm_name, param in params.items():
        if vllm_name in mapped_names:
            if any(p.vllm_name == vllm_name and p.expert is not None for p in placed):
                skipped[vllm_name] = FUSED_ON_BOTH
            continue
        if id(param) in covered:
            tied[vllm_name] = by_object[id(param)]
        elif vllm_name not in {v.get("vllm_name") for v in tensors.values()}:
            extra[vllm_name] = "held by vLLM; no checkpoint tensor maps to it"
    return {
        **base,
        "tensors": tensors,
        "tied": tied,
        "skipped": skipped,
        "extra": extra,
        "refused": None,
        "seconds": round(time.perf_counter() - started, 6),
        "declared": declared,
    }


def _digest_placed(item: _Placed, group: Any, rank: int, size: int) -> RankTensor:
    """This rank's slice digest of one placed tensor, and (TP rank 0) the whole tensor's,
    assembled from every rank's span."""
    import torch.distributed as dist

    span = item.span
    held = item.param.detach() if item.expert is None else item.param.detach()[item.expert]
    local = slice_of(held, span.local_dim, span.local_start, span.local_stop)
    local_sha256 = tensor_sha256(local)
    entry: RankTensor = {
        "held": True,
        "vllm_name": item.vllm_name if item.expert is None else f"{item.vllm_name}[{item.expert}]",
        "dtype": dtype_name(local.dtype),
        "slice": {
            "dim": 0 if span.dim is None else span.dim,
            "start": span.start,
            "stop": span.stop,
            "sha256": local_sha256,
        },
    }
    if span.dim is None or size == 1:
        entry["shape"] = [int(n) for n in local.shape]
        entry["sha256"] = local_sha256 if rank == 0 else None
        return entry
    gathered: list[Any] | None = [None] * size if rank == 0 else None
    dist.gather_object(
        (span.start, span.stop, local.contiguous().cpu()),
        gathered,
        dst=int(group.ranks[0]),
        group=group.cpu_group,
    )
    if rank != 0 or gathered is None:
        entry["shape"] = None
        entry["sha256"] = None
        return entry
    parts: dict[int, tuple[int, torch.Tensor]] = {}
    for start, stop, tensor in gathered:
        parts.setdefault(int(start), (int(stop), tensor))  # replicated KV heads: first copy
    pieces: list[torch.Tensor] = []
    at = 0
    for start in sorted(parts):
        stop, tensor = parts[start]
        if start != at:
            raise RuntimeError(f"{item.name}: the ranks' spans leave a gap at {at}")
        pieces.append(tensor)
        at = stop
    full = torch.cat(pieces, dim=span.dim)
    entry["shape"] = [int(n) for n in full.shape]
    entry["sha256"] = tensor_sha256(full)
    return entry


def merge_ranks(reports: Sequence[RankReport]) -> SideReport:
    """One side report from every rank's ``rank_report`` (rank 0's whole-tensor digests,
    every rank's slices and per-tensor declarations); a RuntimeError when the ranks do not
    form one TP group or declare a tensor differently."""
    ordered = sorted(reports, key=lambda r: int(r["tp_rank"]))
    size = int(ordered[0]["tp_size"]) if ordered else 0
    if [int(r["tp_rank"]) for r in ordered] != list(range(size)):
        raise RuntimeError(f"weight reports came from ranks {[r['tp_rank'] for r in ordered]}")
    head = ordered[0]
    tensors: dict[str, HeldTensor] = {}
    for name, entry in head["tensors"].items():
        slices = []
        for r in ordered:
            held = r["tensors"].get(name)
            if held is not None and held["held"]:
                part = held["slice"]
                slices.append(
                    HeldSlice(
                        rank=int(r["tp_rank"]),
                        dim=part["dim"],
                        start=part["start"],
                        stop=part["stop"],
                        sha256=part["sha256"],
                    )
                )
        shape = entry.get("shape")
        tensors[name] = HeldTensor(
            held=entry["held"],
            shape=None if shape is None else tuple(shape),
            dtype=entry.get("dtype"),
            sha256=entry.get("sha256"),
            slices=tuple(slices),
            vllm_name=entry["vllm_name"],
        )
    refused = next((r["refused"] for r in ordered if r.get("refused")), None)
    packed = tuple(
        HeldPacked(rank=int(r["tp_rank"]), **p) for r in ordered for p in r.get("packed", ())
    )
    return SideReport(
        point=head["point"],
        dtype=head["dtype"],
        tp_size=size,
        seconds=max(float(r.get("seconds", 0.0)) for r in ordered),
        tensors=tensors,
        tied=dict(head["tied"]),
        skipped=dict(head["skipped"]),
        extra=dict(head["extra"]),
        refused=refused,
        packed=packed,
        declared=_declared(ordered),
    )


def _declared(ordered: Sequence[RankReport]) -> dict[str, str]:
    """Every rank's per-tensor declarations (``rank_report``'s ``declared``) as one; a
    RuntimeError when two ranks declare one tensor differently."""
    out: dict[str, str] = {}
    for r in ordered:
        for name, dtype in r.get("declared", {}).items():
            if out.setdefault(name, dtype) != dtype:
                raise RuntimeError(
                    f"{name}: TP rank {r['tp_rank']} declares {dtype}, another rank {out[name]}"
                )
    return dict(sorted(out.items()))


def overlay(loaded: SideReport, live: SideReport) -> SideReport:
    """The load-time side report with every tensor the live model still holds readably taken
    from ``live`` instead (``merge_ranks`` reports both): what the workers hold now where it
    can be read, what they loaded where it cannot (a linear packed by the CPU build). An
    error in either is the result's error."""
    for report in (loaded, live):
        if report.error is not None:
            return SideReport(error=report.error)
    tensors = dict(loaded.tensors)
    tensors.update({n: e for n, e in live.tensors.items() if e.held})
    return msgspec.structs.replace(
        loaded,
        point=f"{loaded.point}; re-read from the live model after an operator was "
        "installed in the workers, where still readable",
        tensors=tensors,
        refused=loaded.refused or live.refused,
    )
