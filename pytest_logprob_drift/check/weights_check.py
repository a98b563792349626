"""The weight check: a side's digests against the checkpoint's, and its offline re-check.

Owns turning one side's ``WeightsDocument`` tensors into the differences they show
(``differences``: a tensor not held, another shape, another dtype than the side declares,
another whole-tensor digest, another digest of one tensor-parallel rank's slice, a tensor held
that no checkpoint tensor maps to), the one-line summary the report shows per side, the
identity-violation lines the verdict receives, and the offline check ``verify`` runs on sealed
documents (``check_weights``): the recorded differences must be exactly those the sealed
digests show, the document must be the side its file names, and an attempt whose weights
differ must be INVALID_IDENTITY. Torch-free; used by the execution path (through the
runtimes, which build the documents) and by ``check.resume``. Knows nothing about engines,
how digests are computed, or files other than the document it is given.
"""

from __future__ import annotations

from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.store.documents import DifferenceKind, WeightDifference, WeightsDocument
from pytest_logprob_drift.store.seal import SealError

DifferenceKey = tuple[str, str, int | None, str]
"""``(name, side, rank, kind)``: what identifies a difference (its detail may carry figures
that only the live tensor gave)."""


def differences(document: WeightsDocument) -> list[WeightDifference]:
    """Every difference ``document``'s digests show, in tensor order, slices after their
    tensor, then unexpected tensors. Details name shapes, dtypes or digest prefixes only."""
    side = document.side
    found: list[WeightDifference] = []

    def add(name: str, rank: int | None, kind: DifferenceKind, detail: str) -> None:
        found.append(WeightDifference(name=name, side=side, rank=rank, kind=kind, detail=detail))

    for t in document.tensors:
        if t.side is None:
            add(t.name, None, "missing", "the side holds no tensor of this checkpoint name")
            continue
        if t.side_shape is not None and tuple(t.side_shape) != tuple(t.shape):
            add(t.name, None, "shape", f"checkpoint {list(t.shape)}, side {list(t.side_shape)}")
            continue
        declared = t.dtype or document.dtype
        if t.side_dtype != declared:
            add(t.name, None, "dtype", f"side holds {t.side_dtype}, declares {declared}")
            continue
        if t.side != t.checkpoint:
            source = f" ({t.source})" if t.source else ""
            cast = declared if t.via is None else f"{t.via} then {declared}"
            add(
                t.name,
                None,
                "values",
                f"sha256 {t.side[:12]} differs from the checkpoint's{source} "
                f"{t.checkpoint[:12]} cast to {cast}",
            )
        for s in t.slices:
            if s.side != s.checkpoint:
                axis = "rows" if s.dim == 0 else "columns"
                add(
                    t.name,
                    s.rank,
                    "slice",
                    f"{axis} [{s.start}, {s.stop}) held by rank {s.rank}: sha256 {s.side[:12]} "
                    f"differs from the checkpoint's {s.checkpoint[:12]}",
                )
    for extra in document.extra:
        add(extra.name, None, "unexpected", extra.reason)
    for p in document.packed:
        if p.held != p.expected:
            add(
                f"{p.layer}.{p.tensor}",
                p.rank,
                "packed",
                f"the prepacked buffer rank {p.rank} holds after processing (sha256 "
                f"{p.held[:12]}) is not vLLM's prepack of what the layer loaded "
                f"({p.expected[:12]}): the kernel reads other experts than were loaded",
            )
    return found


def key(difference: WeightDifference) -> DifferenceKey:
    return (difference.name, difference.side, difference.rank, difference.kind)


def violations(document: WeightsDocument) -> list[str]:
    """The identity-violation lines of ``document``'s recorded differences (none: equal)."""
    return [
        f"weights ({d.side}{'' if d.rank is None else f', TP rank {d.rank}'}): {d.name}: "
        f"{d.kind}: {d.detail}"
        for d in document.differences
    ]


def summary(document: WeightsDocument) -> str:
    """One line: ``N tensors, all equal to the checkpoint cast to bfloat16`` (with what is
    tied and skipped), the refusal, or the differences."""
    if document.refused is not None:
        return f"not checked: {document.refused}"
    extras = [
        f"{t.name}{f' (from {t.source})' if t.source else ''} cast to "
        f"{f'{t.via} then ' if t.via else ''}{t.dtype}"
        for t in document.tensors
        if t.dtype is not None or t.source is not None
    ]
    if document.tied:
        extras.append(", ".join(f"{t.name} tied to {t.shares}" for t in document.tied))
    if document.skipped:
        extras.append(
            f"{len(document.skipped)} skipped ({', '.join(s.name for s in document.skipped)})"
        )
    tail = f"; {'; '.join(extras)}" if extras else ""
    if not document.differences:
        return (
            f"{len(document.tensors)} tensors, all equal to the checkpoint cast to "
            f"{document.dtype}{tail}"
        )
    shown = "; ".join(
        f"{d.name}{'' if d.rank is None else f' (TP rank {d.rank})'}: {d.kind}: {d.detail}"
        for d in document.differences[:3]
    )
    more = len(document.differences) - 3
    return (
        f"{len(document.differences)} difference(s) in {len(document.tensors)} tensors: {shown}"
        + (f"; and {more} more" if more > 0 else "")
    )


def check_weights(name: str, document: WeightsDocument, side: str, outcome: Outcome) -> None:
    """The offline re-check of one sealed weights document (``name``): a SealError naming the
    file unless it is ``side``'s, its recorded differences are exactly those its digests
    show, and an attempt with differences is INVALID_IDENTITY."""
    if document.side != side:
        raise SealError(name, f"holds the {document.side} side's digests, not the {side} side's")
    recorded = [key(d) for d in document.differences]
    recomputed = [key(d) for d in differences(document)]
    if document.refused is not None:
        recomputed = []
    if recorded != recomputed:
        missing = [k for k in recomputed if k not in recorded]
        invented = [k for k in recorded if k not in recomputed]
        shown = missing[:1] or invented[:1]
        raise SealError(
            name,
            f"recorded differences disagree with the sealed digests "
            f"({len(recomputed)} recomputed, {len(recorded)} recorded; first: "
            f"{shown[0][0] if shown else '?'} {shown[0][3] if shown else ''})",
        )
    if recorded and outcome is not Outcome.INVALID_IDENTITY:
        raise SealError(
            name,
            f"records {len(recorded)} weight difference(s) but the outcome is {outcome.value}, "
            "not INVALID_IDENTITY",
        )


FLOATING_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})
"""The dtypes a side may declare (the document's, a tensor's ``dtype`` and ``via``)."""
HELD_DTYPES = FLOATING_DTYPES | {"float8_e4m3fn", "float8_e5m2", "int8", "uint8", "int32"}
"""The dtypes a side may hold a tensor in (``side_dtype``: quantized layouts included)."""
DECLARED_BY = {"rollout": "rollout.dtype", "training": "training.compute_dtype"}
"""The knob whose materialized value is the dtype each side's document declares."""


def check_document(name: str, document: WeightsDocument) -> None:
    """What one sealed weights document must be on its own: known dtypes, each checkpoint
    tensor listed once, each slice a rank of the side's tensor-parallel world inside the
    tensor's shape, each difference listed once; a SealError naming ``name`` otherwise."""
    declared: list[tuple[str, str | None]] = [("dtype", document.dtype)]
    for t in document.tensors:
        declared += [(f"{t.name}: dtype", t.dtype), (f"{t.name}: via", t.via)]
    for what, dtype in declared:
        if dtype is not None and dtype not in FLOATING_DTYPES:
            raise SealError(name, f"{what} {dtype!r} is not a floating dtype")
    seen: set[str] = set()
    for t in document.tensors:
        if t.name in seen:
            raise SealError(name, f"tensor {t.name} is listed twice")
        seen.add(t.name)
        if t.side_dtype is not None and t.side_dtype not in HELD_DTYPES:
            raise SealError(name, f"{t.name}: side_dtype {t.side_dtype!r} is not a known dtype")
        for s in t.slices:
            if s.rank >= document.tensor_parallel_size:
                raise SealError(
                    name,
                    f"{t.name}: a slice of rank {s.rank} at tensor-parallel size "
                    f"{document.tensor_parallel_size}",
                )
            if s.dim >= len(t.shape) or not s.start < s.stop <= t.shape[s.dim]:
                raise SealError(
                    name,
                    f"{t.name}: slice [{s.start}, {s.stop}) of dim {s.dim} is outside its "
                    f"shape {list(t.shape)}",
                )
    keys = [key(d) for d in document.differences]
    if len(set(keys)) != len(keys):
        raise SealError(name, "a difference is listed twice")


def check_pair(
    documents: dict[str, WeightsDocument],
    materialization: object,
    names: tuple[str, str],
    read_back: object = None,
) -> None:
    """The two sides' sealed weights documents against each other and the case: both sealed
    or neither, the same checkpoint tensors, the same checkpoint digest wherever both compare
    a tensor in the same dtype, and each side's dtype the one its engine read back
    (``read_back``: ``actual.json``'s knobs; an engine that fell back silently holds the
    dtype it fell back to, and the case is STRICT_REJECTED for it), else the one its knob
    materialized (``materialization``: the execution-key payload's); a SealError naming the
    file at fault."""
    rollout_name, training_name = names
    if not documents:
        return
    if len(documents) == 1:
        (present,) = documents
        absent = training_name if present == rollout_name else rollout_name
        raise SealError(absent, f"not sealed, but {present} is (a weight check writes both)")
    rollout, training = documents[rollout_name], documents[training_name]
    knobs = materialization if isinstance(materialization, dict) else {}
    actual = read_back if isinstance(read_back, dict) else {}
    for name, document in ((rollout_name, rollout), (training_name, training)):
        path = DECLARED_BY[document.side]
        held = actual.get(path)
        value = held.get("actual") if isinstance(held, dict) else None
        how = "read back"
        if value not in FLOATING_DTYPES:
            knob = knobs.get(path)
            value = knob.get("value") if isinstance(knob, dict) else None
            how = "materialized"
        if value in FLOATING_DTYPES and document.dtype != value:
            raise SealError(name, f"declares dtype {document.dtype}, the case {how} {path}={value}")
    if rollout.refused is not None or training.refused is not None:
        return
    held = {t.name: t for t in rollout.tensors}
    other = {t.name: t for t in training.tensors}
    if set(held) != set(other):
        only = sorted(set(held) ^ set(other))[0]
        where = rollout_name if only in held else training_name
        raise SealError(where, f"lists tensor {only}, the other side does not")
    for tensor_name, r in held.items():
        t = other[tensor_name]
        same_cast = (r.dtype or rollout.dtype, r.via, r.source) == (
            t.dtype or training.dtype,
            t.via,
            t.source,
        )
        if same_cast and r.checkpoint != t.checkpoint:
            raise SealError(
                rollout_name,
                f"{tensor_name}: the checkpoint's digest cast to {r.dtype or rollout.dtype} is "
                f"{r.checkpoint[:12]} here, {t.checkpoint[:12]} in {training_name}",
            )
