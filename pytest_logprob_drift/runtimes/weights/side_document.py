"""One side's sealed weight document: its digests beside the checkpoint's, and the differences.

Owns joining a side report (``side_report.SideReport``: the plain values
``vllm_layout.merge_ranks`` or ``module_digests.module_report`` produce, decoded once) with
the checkpoint's digests cast to the side's declared dtype (``checkpoint``), per tensor and
per rank slice, into a ``store.documents.WeightsDocument``, and recording the differences
``check.weights_check`` finds (the same function ``verify`` runs on the sealed document),
with the max |difference| and the share of differing elements where the caller can hand over
the side's tensor. Knows nothing about engines or cases.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from pytest_logprob_drift.check.weights_check import differences
from pytest_logprob_drift.records import JsonValue
from pytest_logprob_drift.runtimes.weights.checkpoint import (
    SliceSpan,
    Wanted,
    checkpoint_digests,
    checkpoint_names,
    checkpoint_tensors,
)
from pytest_logprob_drift.runtimes.weights.digest import torch_dtype
from pytest_logprob_drift.runtimes.weights.side_report import HeldTensor, SideReport, side_report
from pytest_logprob_drift.store.documents import (
    NamedReason,
    PackedBuffer,
    SliceDigest,
    TensorDigest,
    TiedTensor,
    WeightDifference,
    WeightsDocument,
    WeightSide,
)

SideTensor = Callable[[str], "torch.Tensor | None"]
"""The side's tensor of a checkpoint name when it is at hand (None: not at hand)."""


NOT_HELD = HeldTensor(held=False)


def refused_document(
    side: WeightSide, runtime: str, dtype: str, point: str, reason: str
) -> WeightsDocument:
    """The document of a side whose weights were not checked, with the reason."""
    return WeightsDocument(
        schema_version="cross_config.weights.v1",
        side=side,
        runtime=runtime,
        dtype=dtype,
        point=point,
        tensor_parallel_size=1,
        tensors=(),
        refused=reason,
    )


def side_document(
    *,
    side: WeightSide,
    runtime: str,
    declared_dtype: str,
    report: Mapping[str, JsonValue] | SideReport,
    model_dir: Path,
    declared: Mapping[str, str] | None = None,
    via: Mapping[str, str] | None = None,
    derived: Mapping[str, str] | None = None,
    side_tensor: SideTensor | None = None,
) -> WeightsDocument:
    """``report`` beside the checkpoint's digests cast to ``declared_dtype`` (a tensor of
    ``declared`` to its own dtype). ``derived`` maps a side name the checkpoint lacks to the
    checkpoint tensor it was made from (an untied float32 copy of a tied LM head): it is
    compared with that tensor. ``side_tensor``, when given, hands over the side's tensor of a
    name for the figures of a value difference."""
    typed = side_report(report)
    point = typed.point
    if typed.error is not None:
        return refused_document(side, runtime, declared_dtype, point, typed.error)
    if typed.refused:
        return refused_document(side, runtime, declared_dtype, point, typed.refused)
    held = typed.tensors
    own = declared or {}
    through = via or {}
    copies = dict(derived or {})
    skipped = dict(typed.skipped)
    extra = {k: v for k, v in typed.extra.items() if k not in copies}
    names = [n for n in checkpoint_names(model_dir) if n not in skipped]
    wanted = [
        Wanted(
            name=name,
            source=copies.get(name, name),
            dtype=torch_dtype(own.get(name, declared_dtype)),
            via=torch_dtype(through[name]) if name in through else None,
            spans=tuple(
                SliceSpan(dim=s.dim, start=s.start, stop=s.stop)
                for s in held.get(name, NOT_HELD).slices
            ),
        )
        for name in sorted({*names, *copies})
    ]
    reference = checkpoint_digests(model_dir, wanted)
    tensors = []
    for want in wanted:
        ref = reference.get(want.name)
        if ref is None:
            continue  # a derived name whose source the checkpoint lacks: shown as extra below
        entry = held.get(want.name, NOT_HELD)
        on_side = entry.held
        tensors.append(
            TensorDigest(
                name=want.name,
                shape=ref.shape,
                checkpoint=ref.sha256,
                side=str(entry.sha256) if on_side else None,
                side_shape=entry.shape if on_side and entry.shape else None,
                side_dtype=str(entry.dtype) if on_side else None,
                slices=tuple(
                    SliceDigest(
                        rank=s.rank,
                        dim=s.dim,
                        start=s.start,
                        stop=s.stop,
                        checkpoint=ref.slices[i],
                        side=s.sha256,
                    )
                    for i, s in enumerate(entry.slices)
                )
                if on_side
                else (),
                source=want.source if want.source != want.name else None,
                dtype=own.get(want.name),
                via=through.get(want.name),
            )
        )
    extra.update(
        {
            w.name: f"derived from {w.source}, which the checkpoint lacks"
            for w in wanted
            if w.name not in reference
        }
    )
    document = WeightsDocument(
        schema_version="cross_config.weights.v1",
        side=side,
        runtime=runtime,
        dtype=declared_dtype,
        point=point,
        tensor_parallel_size=typed.tp_size,
        tensors=tuple(tensors),
        tied=tuple(TiedTensor(name=k, shares=v) for k, v in sorted(typed.tied.items())),
        skipped=tuple(NamedReason(name=k, reason=v) for k, v in sorted(skipped.items())),
        extra=tuple(NamedReason(name=k, reason=v) for k, v in sorted(extra.items())),
        packed=tuple(
            PackedBuffer(
                layer=p.layer, tensor=p.tensor, rank=p.rank, expected=p.expected, held=p.held
            )
            for p in typed.packed
        ),
    )
    found = differences(document)
    if side_tensor is not None and any(d.kind == "values" for d in found):
        found = _with_figures(found, document, model_dir, side_tensor)
    return _replace(document, tuple(found))


def _replace(document: WeightsDocument, found: tuple[WeightDifference, ...]) -> WeightsDocument:
    import msgspec

    return msgspec.structs.replace(document, differences=found)


def _with_figures(
    found: list[WeightDifference],
    document: WeightsDocument,
    model_dir: Path,
    side_tensor: SideTensor,
) -> list[WeightDifference]:
    """Each whole-tensor value difference with the max |difference| and the share of
    elements that differ, where the side's tensor is at hand."""
    by_name = {t.name: t for t in document.tensors}
    wanted = {d.name for d in found if d.kind == "values"}
    sources = {(by_name[n].source or n): n for n in wanted}
    figures: dict[str, str] = {}
    for source, tensor in checkpoint_tensors(model_dir):
        name = sources.get(source)
        if name is None:
            continue
        held = side_tensor(name)
        if held is None:
            continue
        dtype = torch_dtype(by_name[name].dtype or document.dtype)
        via = by_name[name].via
        ref = (tensor if via is None else tensor.to(torch_dtype(via))).to(dtype).double()
        got = held.detach().to("cpu").double()
        if got.shape != ref.shape:
            continue
        delta = (got - ref).abs()
        share = float((delta != 0).double().mean())
        figures[name] = f"max |difference| {float(delta.max()):.6g}, {share:.4%} of elements differ"
    return [
        WeightDifference(
            name=d.name,
            side=d.side,
            rank=d.rank,
            kind=d.kind,
            detail=f"{d.detail}; {figures[d.name]}"
            if d.name in figures and d.kind == "values"
            else d.detail,
        )
        for d in found
    ]
