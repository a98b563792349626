"""What each sealed ``.pt`` of an attempt must hold: names, dtype kinds, ranks, one token grid.

Owns the shape of the tensor files an attempt seals, checked once where a sealed ``.pt`` is
loaded (``check.resume.load_sealed_tensors``, which every reader uses): ``score_rollout.pt``
and ``score_training.pt`` (the identity tensors and the side's logprobs on the ``[B, T]``
token grid; the rollout's ``prompt_lengths`` ``[B]`` within ``0..T``; ``position_ids`` are
sealed by an executed attempt and derived from ``attention_mask`` for an imported one, whose
grid determines them: ``check_positions``), ``token_diffs.pt`` (both
sides' logprobs and the active mask on one grid, a single threshold) and ``divergence.pt``
(``numerics.divergence_file``'s reductions on the grid, the worst positions' contributors
``[R, K]`` with ``R`` non-negative rows, the four sampling-processing values; that the grid and
the rows fit the active mask of ``token_diffs.pt`` is ``store.divergence_check``'s). A tensor
of another dtype kind (floating, integer, bool), rank or size than its file declares is a
``SealError`` naming the file and the tensor. ``tensorio`` has already refused what no sealed
tensor can be (complex, sparse, non-contiguous or stride-0 views, storage smaller than the
declared shape). Knows nothing about what the numbers mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from pytest_logprob_drift.numerics.divergence_file import SEALED_TOP_KEYS
from pytest_logprob_drift.numerics.full_vocabulary import DIVERGENCE_FIELDS
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.seal import SealError

FLOATING, INTEGER, BOOL, NUMERIC = "floating", "integer", "bool", "numeric"
"""Dtype kinds; ``numeric`` is floating or integer (a faulty scorer's integer logprobs are
sealed as the evidence of its verdict)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorSpec:
    """One named tensor of a sealed file: its dtype kind and its dimensions, each a symbol
    (``B``, ``T``: the token grid; ``R``, ``K``) the file's tensors must agree on, or a size."""

    kind: str
    dims: tuple[str | int, ...]
    required: bool = True


GRID = ("B", "T")
_IDENTITY = {
    "token_ids": TensorSpec(kind=INTEGER, dims=GRID),
    "attention_mask": TensorSpec(kind=BOOL, dims=GRID),
    "active_mask": TensorSpec(kind=BOOL, dims=GRID),
    "position_ids": TensorSpec(kind=INTEGER, dims=GRID, required=False),
    "logprobs": TensorSpec(kind=NUMERIC, dims=GRID),
}
SCHEMAS: Mapping[str, Mapping[str, TensorSpec]] = {
    layout.SCORE_ROLLOUT: {
        **_IDENTITY,
        "prompt_lengths": TensorSpec(kind=INTEGER, dims=("B",), required=False),
    },
    layout.SCORE_TRAINING: _IDENTITY,
    **{
        name: {key: spec for key, spec in _IDENTITY.items() if key != "position_ids"}
        for name in layout.REPLAY_FILES
    },
    layout.TOKEN_DIFFS: {
        "training_logprobs": TensorSpec(kind=NUMERIC, dims=GRID),
        "rollout_logprobs": TensorSpec(kind=NUMERIC, dims=GRID),
        "active_mask": TensorSpec(kind=BOOL, dims=GRID),
        "threshold": TensorSpec(kind=FLOATING, dims=()),
    },
    layout.DIVERGENCE: {
        **{name: TensorSpec(kind=FLOATING, dims=GRID) for name in DIVERGENCE_FIELDS},
        "processed_rollout_residual": TensorSpec(kind=FLOATING, dims=GRID),
        "processed_training_residual": TensorSpec(kind=FLOATING, dims=GRID),
        "processing": TensorSpec(kind=FLOATING, dims=(4,)),
        SEALED_TOP_KEYS[0]: TensorSpec(kind=INTEGER, dims=("R",)),
        **{name: TensorSpec(kind=FLOATING, dims=("R", "K")) for name in SEALED_TOP_KEYS[2:]},
        SEALED_TOP_KEYS[1]: TensorSpec(kind=INTEGER, dims=("R", "K")),
    },
    **{
        name: {  # numerics.layer_reduction; the rest is diagnostics.layers.check's
            "digests": TensorSpec(kind=INTEGER, dims=("S", "N", 16)),
            "projections": TensorSpec(kind=FLOATING, dims=("S", "N", 64)),
            "norms": TensorSpec(kind=FLOATING, dims=("S", "N")),
            "positions": TensorSpec(kind=INTEGER, dims=("N", 2)),
        }
        for name in layout.LAYER_FILES
    },
    **{
        name: {  # numerics.routing; the rest is diagnostics.routing.check's
            "expert_ids": TensorSpec(kind=INTEGER, dims=("B", "T", "M", "K")),
            "gate_weights": TensorSpec(kind=FLOATING, dims=("B", "T", "M", "K")),
        }
        for name in layout.ROUTING_FILES
    },
}
"""Every tensor each sealed ``.pt`` declares (other names are allowed, checked by tensorio)."""


def grid_positions(attention: torch.Tensor) -> torch.Tensor:
    """The position ids of an imported step's ``[B, T]`` grid (each row's tokens from column
    0, numbered from 0; 0 at padding): what an import sealed before issue 58 holds, and what an
    import since derives instead of sealing them."""
    width = attention.shape[-1]
    return (torch.arange(width, dtype=torch.int64).expand(attention.shape) * attention).contiguous()


def check_positions(scored: Mapping[str, Mapping[str, torch.Tensor]], *, derived: bool) -> None:
    """Each score file's ``position_ids``: required where an engine chose them (``derived``
    False: an executed attempt), optional where the grid determines them (an imported step),
    and then, when sealed (an import sealed before issue 58), equal to ``grid_positions``: a
    SealError naming the file otherwise."""
    for name, tensors in scored.items():
        positions = tensors.get("position_ids")
        if positions is None:
            if not derived:
                raise SealError(name, "has no 'position_ids' tensor")
            continue
        if derived and not torch.equal(
            positions.to(torch.int64), grid_positions(tensors["attention_mask"])
        ):
            raise SealError(
                name,
                "tensor 'position_ids' is not the imported grid's (each row numbered from 0 "
                "over its tokens)",
            )


def _kind(tensor: torch.Tensor) -> str:
    if tensor.dtype == torch.bool:
        return BOOL
    if tensor.is_floating_point():
        return FLOATING
    return INTEGER


def check_sealed_tensors(name: str, tensors: Mapping[str, torch.Tensor]) -> None:
    """Raise SealError naming file ``name`` and the tensor at fault unless ``tensors`` holds
    every tensor its schema requires, of the declared kind, rank and sizes."""
    schema = SCHEMAS.get(name)
    if schema is None:
        return
    sizes: dict[str | int, int] = {}
    for key, spec in schema.items():
        tensor = tensors.get(key)
        if tensor is None:
            if spec.required:
                raise SealError(name, f"has no {key!r} tensor")
            continue
        kind = _kind(tensor)
        if kind != spec.kind and not (spec.kind == NUMERIC and kind != BOOL):
            raise SealError(name, f"tensor {key!r} is {tensor.dtype}, not a {spec.kind} tensor")
        if tensor.dim() != len(spec.dims):
            raise SealError(
                name, f"tensor {key!r} has {tensor.dim()} dimensions, not {len(spec.dims)}"
            )
        for symbol, size in zip(spec.dims, tensor.shape, strict=True):
            want = symbol if isinstance(symbol, int) else sizes.setdefault(symbol, size)
            if size != want:
                raise SealError(
                    name,
                    f"tensor {key!r} has shape {list(tensor.shape)}: its {symbol} dimension "
                    f"is {size}, not {want} as in the file's other tensors",
                )
    _check_indices(name, tensors, sizes)


def _check_indices(
    name: str, tensors: Mapping[str, torch.Tensor], sizes: Mapping[str | int, int]
) -> None:
    """Values used as indices must lie within the grid."""
    if name == layout.SCORE_ROLLOUT and "prompt_lengths" in tensors:
        lengths = tensors["prompt_lengths"]
        if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > sizes["T"]):
            raise SealError(name, f"tensor 'prompt_lengths' holds lengths outside 0..{sizes['T']}")
    if name == layout.DIVERGENCE:  # rows of active positions (the upper bound needs the mask)
        rows = tensors[SEALED_TOP_KEYS[0]]
        if rows.numel() and int(rows.min()) < 0:
            raise SealError(name, f"tensor {SEALED_TOP_KEYS[0]!r} holds negative rows")
