"""A side's weight report as one type: what the workers or ranks digested, decoded once.

Owns ``SideReport`` (with ``HeldTensor`` and ``HeldSlice``), the form of the plain values a
side's processes send back (``vllm_layout.merge_ranks`` over the vLLM workers'
``collective_rpc`` results, which vLLM sends as untyped msgpack; ``module_digests.module_report``
in an FSDP rank or this process), and ``side_report``, which decodes them with
``msgspec.convert`` once, where they arrive, so that ``side_document`` reads typed members
instead of re-parsing dictionaries. A report that is not that shape is an error report naming
the member. Knows nothing about engines or checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Required, TypedDict

import msgspec

from pytest_logprob_drift.records import JsonValue

Index = Annotated[int, msgspec.Meta(ge=0)]


class HeldSlice(msgspec.Struct, frozen=True, kw_only=True):
    """One tensor-parallel rank's slice of a tensor: ``[start, stop)`` along ``dim`` of the
    checkpoint's layout, and the digest of what that rank holds."""

    rank: Index
    dim: Index
    start: Index
    stop: Index
    sha256: str


class HeldTensor(msgspec.Struct, frozen=True, kw_only=True):
    """What a side holds under one checkpoint name: whether it holds it, its shape and dtype,
    the whole tensor's digest (None where this rank did not assemble it) and the rank slices."""

    held: bool
    shape: tuple[Index, ...] | None = None
    dtype: str | None = None
    sha256: str | None = None
    slices: tuple[HeldSlice, ...] = ()
    vllm_name: str | None = None


class HeldPacked(msgspec.Struct, frozen=True, kw_only=True):
    """One rank's prepacked expert buffer read back after processing: the layer and tensor
    (vLLM's names), the digest of vLLM's prepack of what the layer loaded (``expected``) and
    of what it holds (``held``)."""

    layer: str
    tensor: str
    rank: Index
    expected: str
    held: str


class SideReport(msgspec.Struct, frozen=True, kw_only=True):
    """A side's digests of its weights (``error``: none were taken, and why; ``refused``: a
    layout the mapping does not cover)."""

    point: str = ""
    dtype: str = "none"
    tp_size: Annotated[int, msgspec.Meta(ge=1)] = 1
    tensors: dict[str, HeldTensor] = {}
    tied: dict[str, str] = {}
    skipped: dict[str, str] = {}
    extra: dict[str, str] = {}
    refused: str | None = None
    seconds: float = 0.0
    error: str | None = None
    packed: tuple[HeldPacked, ...] = ()
    declared: dict[str, str] = {}
    """Checkpoint name -> the dtype the side declares it in, where not ``dtype`` (a vLLM
    parameter constructed in another dtype: ``vllm_layout.constructed_dtypes``); empty: every
    tensor is declared ``dtype`` (as in reports from before this member)."""


class RankSlice(TypedDict):
    """One vLLM worker's slice of a tensor as it sends it (``HeldSlice`` without the rank)."""

    dim: int
    start: int
    stop: int
    sha256: str


class RankTensor(TypedDict, total=False):
    """One checkpoint tensor as one vLLM worker sends it (``vllm_layout.rank_report``): held
    or not, and where held its dtype, this rank's ``slice`` and (TP rank 0) shape and digest."""

    held: Required[bool]
    vllm_name: Required[str]
    dtype: str
    slice: RankSlice
    shape: list[int] | None
    sha256: str | None


class RankPacked(TypedDict):
    """One prepacked expert buffer as one vLLM worker sends it (``HeldPacked`` without the
    rank)."""

    layer: str
    tensor: str
    expected: str
    held: str


class RankReport(TypedDict, total=False):
    """One vLLM worker's weight digests as plain values (``collective_rpc`` sends them as
    untyped msgpack; ``vllm_layout.merge_ranks`` makes one ``SideReport`` of every rank's);
    ``error`` alone when the worker took none."""

    tp_rank: int
    tp_size: int
    point: str
    dtype: str
    tensors: dict[str, RankTensor]
    tied: dict[str, str]
    skipped: dict[str, str]
    extra: dict[str, str]
    refused: str | None
    seconds: float
    error: str
    packed: list[RankPacked]
    declared: dict[str, str]


def side_report(plain: Mapping[str, JsonValue] | SideReport) -> SideReport:
    """``plain`` (what a side's processes sent back) as a ``SideReport``; one that is not that
    shape becomes an error report saying where."""
    if isinstance(plain, SideReport):
        return plain
    try:
        return msgspec.convert(dict(plain), SideReport)
    except msgspec.ValidationError as exc:
        return SideReport(point=str(plain.get("point", "")), error=f"weight report: {exc}")
