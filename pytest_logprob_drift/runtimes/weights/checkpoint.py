"""The checkpoint's own digests: every tensor of its safetensors files, cast to a side's dtype.

Owns reading a local checkpoint directory's ``*.safetensors`` files (one tensor at a time,
memory-mapped by ``safetensors``) and returning, per tensor name, its shape, its stored dtype,
the digest of the whole tensor cast to the side's declared dtype and the digest of each slice a
side reports holding (one tensor-parallel rank's rows or columns). This is the reference each
side is compared with; it is read from the files, never from an engine. A process keeps each
reference it computed, keyed by the files as they are (path, inode, size, modification time)
and what was asked, so the cases and sides of a run that ask for the same reference hash the
checkpoint once. Knows nothing about engines, layouts or comparison.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from pytest_logprob_drift.runtimes.weights.digest import cast_sha256, dtype_name, slice_of


@dataclass(frozen=True, slots=True, kw_only=True)
class SliceSpan:
    """Rows (``dim`` 0) or columns (``dim`` 1) ``[start, stop)`` of a checkpoint tensor."""

    dim: int
    start: int
    stop: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointTensor:
    """One checkpoint tensor's reference: shape, stored dtype, digest cast to the side's
    dtype, and the digest of each requested slice (same order as asked)."""

    name: str
    shape: tuple[int, ...]
    stored_dtype: str
    sha256: str
    slices: tuple[str, ...] = ()


def safetensors_files(model_dir: Path) -> list[Path]:
    """The checkpoint's ``*.safetensors`` files, sorted; ValueError when there are none."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir} has no *.safetensors file")
    return files


def checkpoint_tensors(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every ``(name, tensor)`` of the checkpoint, file by file, as stored."""
    from safetensors import safe_open

    for path in safetensors_files(model_dir):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                yield name, handle.get_tensor(name)


def checkpoint_names(model_dir: Path) -> list[str]:
    """The tensor names of the checkpoint (headers only)."""
    from safetensors import safe_open

    names: list[str] = []
    for path in safetensors_files(model_dir):
        with safe_open(str(path), framework="pt") as handle:
            names.extend(handle.keys())
    return names


@dataclass(frozen=True, slots=True, kw_only=True)
class Wanted:
    """One reference a side needs: checkpoint tensor ``source`` cast to ``dtype``, whole and at
    each of ``spans``, reported under ``name`` (the source's own name, or the side's name of a
    tensor derived from it: an untied float32 copy of a tied LM head)."""

    name: str
    source: str
    dtype: torch.dtype
    spans: tuple[SliceSpan, ...] = ()
    via: torch.dtype | None = None
    """A dtype the tensor passes through first (a float32 LM head copied from a bfloat16
    body holds the checkpoint cast to bfloat16, then to float32)."""


_FilesKey = tuple[tuple[str, int, int, int], ...]
_REFERENCES: dict[tuple[_FilesKey, Wanted], CheckpointTensor | None] = {}
"""Every reference this process computed (None: the checkpoint lacks its source)."""


def _files_key(model_dir: Path) -> _FilesKey:
    """The checkpoint's files as they are now: a rewritten file is another key."""
    key = []
    for path in safetensors_files(model_dir):
        status = path.stat()
        key.append((str(path.resolve()), status.st_ino, status.st_size, status.st_mtime_ns))
    return tuple(key)


def forget_references() -> None:
    """Drop every kept reference (the next call computes from the files again)."""
    _REFERENCES.clear()


def checkpoint_digests(
    model_dir: Path, wanted: Sequence[Wanted], *, threads: int | None = None
) -> dict[str, CheckpointTensor]:
    """Each ``Wanted`` reference, keyed by its name: kept from an earlier call on the same
    files, else computed (``_computed``). A source the checkpoint lacks is absent from the
    result."""
    files = _files_key(model_dir)
    missing = [want for want in wanted if (files, want) not in _REFERENCES]
    if missing:
        computed = _computed(model_dir, missing, threads=threads)
        for want in missing:
            _REFERENCES[(files, want)] = computed.get(want.name)
    found = ((want.name, _REFERENCES[(files, want)]) for want in wanted)
    return {name: reference for name, reference in found if reference is not None}


def _computed(
    model_dir: Path, wanted: Sequence[Wanted], *, threads: int | None
) -> dict[str, CheckpointTensor]:
    """Each ``Wanted`` reference, keyed by its name, reading each checkpoint tensor once.
    Tensors are cast and hashed on ``threads`` threads (default: up to 8, one per CPU;
    ``hashlib`` and torch's casts release the GIL), one tensor per task."""

    by_source: dict[str, list[Wanted]] = {}
    for want in wanted:
        by_source.setdefault(want.source, []).append(want)

    def digest(want: Wanted, tensor: torch.Tensor) -> CheckpointTensor:
        cast = (tensor if want.via is None else tensor.to(want.via)).to(want.dtype)
        whole = cast_sha256(cast, want.dtype)
        shape = tuple(int(n) for n in tensor.shape)
        return CheckpointTensor(
            name=want.name,
            shape=shape,
            stored_dtype=dtype_name(tensor.dtype),
            sha256=whole,
            slices=tuple(
                whole  # a span over the whole tensor (a replicated one) is the tensor
                if s.dim < len(shape) and (s.start, s.stop) == (0, shape[s.dim])
                else cast_sha256(slice_of(cast, s.dim, s.start, s.stop), want.dtype)
                for s in want.spans
            ),
        )

    workers = threads or max(1, min(8, os.cpu_count() or 1))
    out: dict[str, CheckpointTensor] = {}
    pending: list[Future[CheckpointTensor]] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for source, tensor in checkpoint_tensors(model_dir):
            for want in by_source.get(source, ()):
                pending.append(pool.submit(digest, want, tensor))
            while len(pending) > 2 * workers:  # at most 2 tensors per thread in memory
                done = pending.pop(0).result()
                out[done.name] = done
        for future in pending:
            done = future.result()
            out[done.name] = done
    return out
