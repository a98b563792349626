"""The digest of one tensor: SHA-256 of its row-major bytes in a named dtype.

Owns the one definition every side and the checkpoint share, so that anyone can recompute a
digest with ``hashlib`` and a torch cast: ``tensor.to(dtype).contiguous()`` (on the CPU),
its bytes in row-major order as safetensors stores them (little-endian, as every platform this
tool runs on), hashed whole. A slice of a tensor (one tensor-parallel rank's share) is digested
the same way after ``narrow(dim, start, stop - start)``. Knows nothing about checkpoints,
engines, names or comparison.
"""

from __future__ import annotations

import hashlib
from typing import Final

import torch

DTYPES: Final[dict[str, torch.dtype]] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
"""The declared dtypes a side may hold its weights in, by the name the knobs use."""


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``bfloat16``."""
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype a declared dtype name denotes; ValueError for another name."""
    if name not in DTYPES:
        raise ValueError(f"no weight dtype {name!r} (one of {', '.join(DTYPES)})")
    return DTYPES[name]


def tensor_sha256(tensor: torch.Tensor) -> str:
    """SHA-256 (hex) of ``tensor``'s bytes, row-major, in its own dtype, on the CPU."""
    data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(data.numpy().data).hexdigest()


def cast_sha256(tensor: torch.Tensor, dtype: torch.dtype) -> str:
    """SHA-256 of ``tensor`` cast to ``dtype`` (the checkpoint's tensor as a side declares it)."""
    return tensor_sha256(tensor.detach().to(device="cpu", dtype=dtype))


def slice_of(tensor: torch.Tensor, dim: int, start: int, stop: int) -> torch.Tensor:
    """Rows (``dim`` 0) or columns (``dim`` 1) ``[start, stop)`` of ``tensor``."""
    return tensor.narrow(dim, start, stop - start)
