"""Bounded reductions of captured hidden states, and the figures two reductions give.

Owns what the layer diagnostics (``diagnostics.layers``) keep of a state instead of the state
itself, and what they compute from what was kept. A *state* is one of the ``L + 3`` points of
the network read at every captured position: ``0`` (the embeddings), ``k`` (the residual
stream after ``k`` decoder layers, before the final norm), ``final_norm`` (its output) and
``logits`` (the LM head's output). Per state and position the reduction keeps:

- ``digests``: the first ``DIGEST_BYTES`` bytes of SHA-256 over the state's dtype name and its
  raw bytes: equal digests are bitwise equal states (across sides and against a baseline);
- ``projections``: ``x @ R`` in float64 with ``R`` a fixed ``[width, PROJECTION_DIM]`` Gaussian
  matrix drawn from ``PROJECTION_SEED`` (entries ``N(0, 1/PROJECTION_DIM)``), so for any
  difference ``d`` of two states ``|R^T d|^2 / |d|^2`` is chi-square with
  ``PROJECTION_DIM`` degrees of freedom over ``R``: the relative error read from projections
  lies within ``RELATIVE_ERROR_BAND`` of the exact one with probability >= 0.999 per position
  (the median over many positions is much tighter);
- ``norms``: the exact L2 norm of the state in float64.

So a side seals ``(16 + 8 * 64 + 8)`` bytes per state and position instead of ``4 * width``.
Figures between two reductions of the same positions (``compare``): per state the share of
bitwise-equal positions, the median and max relative error ``|a - b| / |a|`` (0 exactly where
the digests are equal, else from the projections and ``a``'s exact norm), the median cosine
(from the exact norms and the estimated difference) and the first state whose positions are
not all bitwise equal. Pure functions of tensors: knows no model, engine or file.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from typing import Any, Final

import torch

from pytest_logprob_drift.numerics.layer_states import FINAL_NORM, LOGITS

PROJECTION_DIM: Final = 64
PROJECTION_SEED: Final = 20261201
DIGEST_BYTES: Final = 16
RELATIVE_ERROR_BAND: Final = (0.70, 1.30)
"""Per position, estimated / exact relative error lies in this band with probability >= 0.999
(the 0.0005 and 0.9995 quantiles of sqrt(chi2_64 / 64) are about 0.71 and 1.29)."""
BLOCK_ROWS: Final = 2048
"""Rows projected at a time: the float64 copy of a block of states is the reduction's largest
temporary (2048 x 4096 x 8 bytes = 64 MiB at S3's width)."""
REDUCTION_TENSORS: Final = frozenset({"digests", "projections", "norms", "positions"})

Tensors = Mapping[str, torch.Tensor]


def state_names(decoder_layers: int) -> tuple[str, ...]:
    """``("0", "1", ..., "L", "final_norm", "logits")``."""
    return (*(str(k) for k in range(decoder_layers + 1)), FINAL_NORM, LOGITS)


@functools.lru_cache(maxsize=8)
def _projection(width: int) -> torch.Tensor:
    generator = torch.Generator(device="cpu").manual_seed(PROJECTION_SEED + width)
    matrix = torch.randn((width, PROJECTION_DIM), generator=generator, dtype=torch.float64)
    scaled: torch.Tensor = matrix / PROJECTION_DIM**0.5
    return scaled


def projection_matrix(width: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The fixed float64 ``[width, PROJECTION_DIM]`` projection for states of ``width``
    (drawn once per width and process; never write into it)."""
    return _projection(width).to(device)


def state_digests(states: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N, DIGEST_BYTES]``: per row, SHA-256 over the dtype name and the row's bytes."""
    rows = states.detach().contiguous().cpu()
    tag = str(rows.dtype).encode() + b"\0"
    raw = rows.view(torch.uint8).reshape(rows.shape[0], -1).numpy() if rows.numel() else None
    out = torch.zeros((rows.shape[0], DIGEST_BYTES), dtype=torch.uint8)
    for i in range(rows.shape[0]):
        assert raw is not None
        digest = hashlib.sha256(tag + raw[i].tobytes()).digest()[:DIGEST_BYTES]
        out[i] = torch.frombuffer(bytearray(digest), dtype=torch.uint8)
    return out


def reduce_states(
    states: torch.Tensor, projection: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(digests, projections, norms)`` of ``[N, width]`` states: uint8 ``[N, 16]``, float64
    ``[N, 64]`` and float64 ``[N]`` on CPU. The projection is computed where the states are."""
    if states.dim() != 2:
        raise ValueError(f"states must be [positions, width], got shape {tuple(states.shape)}")
    matrix = projection if projection is not None else projection_matrix(states.shape[1])
    matrix = matrix.to(states.device)
    projected, norms = [], []
    for start in range(0, max(int(states.shape[0]), 1), BLOCK_ROWS):  # bounded float64 copies
        wide = states[start : start + BLOCK_ROWS].detach().to(torch.float64)
        projected.append((wide @ matrix).cpu())
        norms.append(torch.linalg.vector_norm(wide, dim=-1).cpu())
    return state_digests(states), torch.cat(projected), torch.cat(norms)


def reduction_sha256(tensors: Tensors) -> str:
    """Hex SHA-256 over ``tensors`` in name order: each name, dtype and shape, then its raw
    bytes. Equal digests are bitwise equal reductions; it depends only on the tensors (not on
    how a container such as ``torch.save`` lays them out), so two processes that reduced the
    same states can compare it without sending the reductions themselves."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().contiguous().cpu()
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        if tensor.numel():
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def stack_reductions(
    per_state: list[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]],
    positions: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """One side's sealed tensors from per-state lists of per-chunk reductions:
    ``digests`` uint8 ``[S, N, 16]``, ``projections`` float64 ``[S, N, 64]``, ``norms``
    float64 ``[S, N]`` and ``positions`` int64 ``[N, 2]`` (row, state position). Each state's
    chunks are released from ``per_state`` as soon as they are copied, so the peak is the
    output plus one state's chunks, not twice the output."""
    n, s = int(positions.shape[0]), len(per_state)
    digests = torch.zeros((s, n, DIGEST_BYTES), dtype=torch.uint8)
    projections = torch.zeros((s, n, PROJECTION_DIM), dtype=torch.float64)
    norms = torch.zeros((s, n), dtype=torch.float64)
    for i in range(s):
        chunks, per_state[i] = per_state[i], []
        offset = 0
        for d, p, m in chunks:
            k = int(d.shape[0])
            if offset + k > n:
                break
            digests[i, offset : offset + k] = d
            projections[i, offset : offset + k] = p
            norms[i, offset : offset + k] = m
            offset += k
        else:
            if offset == n:
                continue
        total = sum(int(c[0].shape[0]) for c in chunks)
        raise ValueError(f"a state has {total} captured positions, expected {n}")
    return {
        "digests": digests,
        "projections": projections,
        "norms": norms,
        "positions": positions.to(torch.long),
    }


def capture_mask(active_mask: torch.Tensor, positions_per_row: int | None) -> torch.Tensor:
    """The active tokens whose scoring positions a layer capture reads: all of ``active_mask``
    (None), or per row at most ``positions_per_row`` of its ``n`` active tokens, evenly spaced
    by integer arithmetic (indices ``i * (n - 1) // (k - 1)`` for ``i < k``; ``k = 1``: the
    last), so the first and last active tokens are always among them and every machine picks
    the same ones. A subset of ``active_mask``, same shape and dtype."""
    if positions_per_row is None:
        return active_mask
    if positions_per_row < 1:
        raise ValueError(f"positions_per_row must be >= 1, got {positions_per_row}")
    chosen = torch.zeros_like(active_mask)
    k = positions_per_row
    for row in range(int(active_mask.shape[0])):
        where = active_mask[row].nonzero().flatten()
        n = int(where.numel())
        if n <= k:
            picks = list(range(n))
        elif k == 1:
            picks = [n - 1]
        else:
            picks = [i * (n - 1) // (k - 1) for i in range(k)]
        chosen[row, where[picks]] = True
    return chosen


def check_reduction(tensors: Tensors, states: int | None = None) -> None:
    """ValueError unless ``tensors`` is one side's well-formed reduction."""
    if set(tensors) != REDUCTION_TENSORS:
        raise ValueError(f"expected tensors {sorted(REDUCTION_TENSORS)}, found {sorted(tensors)}")
    d, p, m, pos = (tensors[k] for k in ("digests", "projections", "norms", "positions"))
    if d.dtype != torch.uint8 or p.dtype != torch.float64 or m.dtype != torch.float64:
        raise ValueError("digests must be uint8, projections and norms float64")
    if pos.dtype != torch.long or pos.dim() != 2 or pos.shape[1] != 2:
        raise ValueError("positions must be int64 [N, 2]")
    s, n = (d.shape[0], d.shape[1]) if d.dim() == 3 else (-1, -1)
    if tuple(d.shape) != (s, n, DIGEST_BYTES) or tuple(p.shape) != (s, n, PROJECTION_DIM):
        raise ValueError("digests / projections have the wrong shape")
    if tuple(m.shape) != (s, n) or pos.shape[0] != n:
        raise ValueError("norms / positions disagree with the digests' shape")
    if s < 4 or (states is not None and s != states):
        raise ValueError(f"{s} states, expected {states if states is not None else '>= 4'}")
    if not (bool(torch.isfinite(p).all()) and bool(torch.isfinite(m).all())):
        raise ValueError("projections and norms must be finite")


def _median(values: torch.Tensor) -> float:
    """The lower median (a selected element: exact, reproducible anywhere)."""
    return float(values.median()) if values.numel() else 0.0


def compare(reference: Tensors, other: Tensors) -> dict[str, Any]:
    """Figures of ``other`` against ``reference`` (same states, same positions): per state
    ``bitwise_equal_share``, ``median_rel_error``, ``max_rel_error``, ``median_cosine``, and
    ``first_unequal_state`` (None: every state bitwise equal at every position)."""
    check_reduction(reference)
    check_reduction(other, int(reference["digests"].shape[0]))
    if not torch.equal(reference["positions"], other["positions"]):
        raise ValueError("the two reductions are of different positions")
    names = state_names(int(reference["digests"].shape[0]) - 3)
    equal = (reference["digests"] == other["digests"]).all(-1)  # [S, N]
    diff = torch.linalg.vector_norm(reference["projections"] - other["projections"], dim=-1)
    a, b = reference["norms"], other["norms"]
    rel = torch.where(equal, torch.zeros_like(diff), diff / a.clamp_min(1e-300))
    cos = ((a * a + b * b - diff * diff) / (2 * a * b).clamp_min(1e-300)).clamp(-1.0, 1.0)
    cos = torch.where(equal, torch.ones_like(cos), cos)
    rows = []
    first = None
    for s, name in enumerate(names):
        share = float(equal[s].double().mean()) if equal.shape[1] else 1.0
        if first is None and share < 1.0:
            first = name
        rows.append(
            {
                "state": name,
                "bitwise_equal_share": share,
                "median_rel_error": _median(rel[s]),
                "max_rel_error": float(rel[s].max()) if rel.shape[1] else 0.0,
                "median_cosine": _median(cos[s]) if cos.shape[1] else 1.0,
            }
        )
    return {"positions": int(equal.shape[1]), "states": rows, "first_unequal_state": first}


def relative_errors(reference: Tensors, other: Tensors) -> torch.Tensor:
    """float64 ``[S, N]``: the per-state, per-position relative error behind ``compare``."""
    equal = (reference["digests"] == other["digests"]).all(-1)
    diff = torch.linalg.vector_norm(reference["projections"] - other["projections"], dim=-1)
    rel = diff / reference["norms"].clamp_min(1e-300)
    return torch.where(equal, torch.zeros_like(rel), rel)
