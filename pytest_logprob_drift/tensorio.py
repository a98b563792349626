"""The tensor wire format: a mapping of names to tensors as bytes, and back.

Owns the one serializer used for sealed ``.pt`` artifacts and for tensors crossing a process
boundary (FSDP ranks): ``torch.save`` of detached, contiguous CPU tensors, read back with
``torch.load(..., weights_only=True)`` so no pickle code ever runs, and refused unless it is a
mapping of string names to dense, real, contiguous tensors each backed by its own storage
(nothing a reader then does can turn a few bytes into gigabytes); torch's warnings while it
reads foreign bytes are not shown (the refusal says why). Knows nothing about seals, files or
what the tensors mean.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Mapping

import torch


class TensorFormatError(Exception):
    """Bytes that are not a weights-only mapping of names to tensors."""


def tensor_bytes(tensors: Mapping[str, torch.Tensor]) -> bytes:
    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, buffer)
    return buffer.getvalue()


def inflation_problem(data: bytes) -> str | None:
    """Why ``data`` must not be handed to ``torch.load`` (None: nothing found): its zip
    members declare more bytes than the file holds. ``torch.save`` stores them uncompressed,
    so a compressed member is not ours, and loading it would inflate a small file into
    gigabytes before anything could refuse it. Bytes that are no zip are torch.load's to
    refuse."""
    import zipfile

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            declared = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError):
        return None
    if declared > len(data):
        return (
            f"its zip members declare {declared} bytes, more than the {len(data)} bytes of the "
            "file (torch.save stores them uncompressed): refused before loading"
        )
    return None


def tensors_from_bytes(data: bytes) -> dict[str, torch.Tensor]:
    """The tensors ``data`` holds; ``TensorFormatError`` (the reason) for anything else. What
    torch warns while it refuses foreign bytes (a pickle protocol it did not write, say) is
    kept off the terminal: the refusal is the reason, not a warning. Bytes whose zip members
    declare more than the file holds are refused before loading (``inflation_problem``)."""
    inflated = inflation_problem(data)
    if inflated is not None:
        raise TensorFormatError(f"not a weights-only tensor file: {inflated}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # any unpickling failure means the bytes are not ours
        raise TensorFormatError(
            f"not a weights-only tensor file: {type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(loaded, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items()
    ):
        raise TensorFormatError("expected a mapping of names to tensors")
    for name, tensor in loaded.items():
        problem = _not_written_here(tensor)
        if problem is not None:
            raise TensorFormatError(f"tensor {name!r} {problem}")
    return loaded


def _not_written_here(tensor: torch.Tensor) -> str | None:
    """Why ``tensor`` is not one ``tensor_bytes`` writes (None when it could be): a dense,
    real-valued, contiguous CPU tensor whose own storage holds every element it declares (a
    stride-0 view of a few bytes declaring gigabytes is refused before anything reads it)."""
    if tensor.layout != torch.strided:
        return f"has layout {tensor.layout}, not a dense tensor"
    if tensor.is_complex() or tensor.is_quantized or tensor.dtype not in _REAL_DTYPES:
        return f"has dtype {tensor.dtype}; refused"
    if not tensor.is_contiguous():
        return f"is a non-contiguous view (strides {list(tensor.stride())}); refused"
    needed = (tensor.storage_offset() + tensor.numel()) * tensor.element_size()
    if tensor.untyped_storage().nbytes() < needed:
        return f"declares {needed} bytes but its storage holds {tensor.untyped_storage().nbytes()}"
    return None


_REAL_DTYPES = frozenset(
    {
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
    }
)
"""The dtypes a sealed or exchanged tensor may have."""
