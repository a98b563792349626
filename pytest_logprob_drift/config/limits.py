"""What execution can accept, known before anything executes.

Owns the limits that execution (the artifact store, torch and numpy generators, the runtimes'
embeddings) would otherwise hit only after planning succeeded, so that planning refuses a
config for the same reason and names the JSON path instead:

- ``experiment_id`` is a directory name: at most ``MAX_EXPERIMENT_ID_BYTES`` bytes of UTF-8
  (file systems count bytes, 255 per name; the rest is room for suffixes);
- ``sampling.seed`` seeds numpy (vLLM's engine seed: ``0 .. 2**32 - 1``) and every per-sample
  generator seed a runtime derives from it must fit torch's generators (``< 2**64``): the smoke
  runtime's ``seed * 1_000_003 + index``, vLLM's ``seed + index`` (the transformers runtime
  hashes it to 63 bits, which always fits);
- prompt plus ``sampling.max_new_tokens`` fits the checkpoint's context where it is known,
  and ``MAX_SEQUENCE_TOKENS`` everywhere;
- token ids fit ``torch.long`` and, where the checkpoint's vocabulary
  and context length are known at planning (the fixed ``synthetic://`` and ``tiny://``
  checkpoints, a local checkpoint directory's ``config.json``), lie inside them;
- a path the runtimes open (a checkpoint directory) holds no NUL character and no name or
  length that a file system refuses (``ENAMETOOLONG``).

Reads a local checkpoint's ``config.json`` as JSON; never imports torch or a runtime. The
fixed vocabularies mirror the runtimes' constants (a test keeps them equal).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

MAX_EXPERIMENT_ID_BYTES = 200
"""UTF-8 bytes of an experiment id: a directory name (255 bytes on common file systems)
with room for suffixes."""
MAX_SEED = 2**32 - 1
"""numpy's seed range, which vLLM seeds with ``sampling.seed``."""
MAX_GENERATOR_SEED = 2**64 - 1
"""torch's ``Generator.manual_seed`` range (non-negative part)."""
MAX_TOKEN_ID = 2**63 - 1
"""int64 (``torch.long``): the dtype of every runtime's token-id tensors."""
MAX_SEQUENCE_TOKENS = 1 << 20
"""Prompt plus new tokens of one sample when the checkpoint's context length is not known at
planning: the longest context windows of released models (about a million tokens). Beyond it
every runtime would allocate ``[samples, tokens]`` scores (and the smoke runtime generate) for
nothing any checkpoint can attend to."""
CONFIG_JSON_LIMIT = 16 << 20
"""A local checkpoint's config.json larger than this is not read at planning."""


class CheckpointLimits:
    """What planning knows about a checkpoint (None: unknown). A plain class: a dataclass or
    NamedTuple costs more to create at import than ``plan`` spends planning a case."""

    __slots__ = ("max_positions", "vocab_size")

    def __init__(self, vocab_size: int | None = None, max_positions: int | None = None) -> None:
        self.vocab_size = vocab_size
        self.max_positions = max_positions


FIXED_CHECKPOINTS: Mapping[str, CheckpointLimits] = {
    "synthetic://cpu-smoke/v1": CheckpointLimits(vocab_size=64),
    "tiny://qwen3-h64-v1": CheckpointLimits(vocab_size=1024, max_positions=512),
}
"""The checkpoints with a fixed definition: the smoke runtime's synthetic model and the tiny
checkpoints built from code."""
FIXED_SCHEMES = ("synthetic://", "tiny://")


def derived_seeds(seed: int, samples: int) -> Mapping[str, int]:
    """The largest per-sample torch generator seed each runtime derives from ``seed``."""
    last = max(samples - 1, 0)
    return {
        "the cpu-smoke runtime's seed * 1_000_003 + index": seed * 1_000_003 + last,
        "the vllm-hf runtime's seed + index": seed + last,
    }


def experiment_id_fault(experiment_id: str) -> str | None:
    try:
        size = len(experiment_id.encode("utf-8"))
    except UnicodeEncodeError:
        return "not valid Unicode"
    if size > MAX_EXPERIMENT_ID_BYTES:
        return (
            f"too long: {size} bytes of UTF-8 ({len(experiment_id)} characters); it names the "
            f"run directory, so at most {MAX_EXPERIMENT_ID_BYTES} bytes"
        )
    return None


def seed_fault(seed: int, samples: int) -> str | None:
    if seed > MAX_SEED:
        return f"{seed} is out of range: seeds must be 0 .. {MAX_SEED} (vLLM seeds numpy with it)"
    for what, derived in derived_seeds(seed, samples).items():
        if derived > MAX_GENERATOR_SEED:  # pragma: no cover - implied by MAX_SEED today
            return f"{seed} is out of range: {what} exceeds torch's generator range"
    return None


def checkpoint_limits(uri: str) -> tuple[CheckpointLimits, str | None]:
    """What is known about checkpoint ``uri`` before execution, and why no runtime could
    serve it (None when one might)."""
    if "\0" in uri:
        return CheckpointLimits(), "contains a NUL character; no file system accepts it"
    fault = path_fault(uri)
    if fault is not None and not uri.startswith(FIXED_SCHEMES):
        return CheckpointLimits(), fault
    if uri.startswith(FIXED_SCHEMES):
        known = FIXED_CHECKPOINTS.get(uri)
        if known is None:
            names = ", ".join(u for u in FIXED_CHECKPOINTS if u.startswith(uri.split("//")[0]))
            return CheckpointLimits(), f"unknown checkpoint {uri!r} (known: {names})"
        return known, None
    return _local_limits(Path(uri)), None


MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4095


def path_fault(path: str) -> str | None:
    """Why no file system would accept ``path`` (a name over 255 bytes, a path over 4095)."""
    encoded = os.fsencode(path)
    if len(encoded) > MAX_PATH_BYTES:
        return f"is {len(encoded)} bytes long; no file system accepts a path over 4095"
    longest = max(len(part) for part in encoded.split(b"/"))
    if longest > MAX_NAME_BYTES:
        return f"has a {longest}-byte name; no file system accepts a name over 255 bytes"
    return None


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _local_limits(directory: Path) -> CheckpointLimits:
    config = directory / "config.json"
    try:
        if not config.is_file() or config.stat().st_size > CONFIG_JSON_LIMIT:
            return CheckpointLimits()
        document = json.loads(config.read_bytes())
    except (OSError, ValueError, RecursionError):
        return CheckpointLimits()  # not a readable checkpoint (yet): execution will say
    if not isinstance(document, dict):
        return CheckpointLimits()
    text = document.get("text_config")
    nested = text if isinstance(text, dict) else {}
    return CheckpointLimits(
        vocab_size=_positive(document.get("vocab_size")) or _positive(nested.get("vocab_size")),
        max_positions=_positive(document.get("max_position_embeddings"))
        or _positive(nested.get("max_position_embeddings")),
    )


def token_fault(
    rows: Sequence[Sequence[int]], uri: str, vocab_size: int | None
) -> tuple[str, str] | None:
    """The first token id of ``rows`` that no runtime could embed: its position (``[i][j]``)
    and why (None when every id fits)."""
    limit = MAX_TOKEN_ID if vocab_size is None else min(vocab_size - 1, MAX_TOKEN_ID)
    for i, row in enumerate(rows):
        if max(row) <= limit:
            continue
        j = next(j for j, token in enumerate(row) if token > limit)
        more = sum(1 for r in rows[i:] for t in r if t > limit) - 1
        tail = f"; {more} more out-of-range id(s) follow" if more else ""
        if vocab_size is not None and row[j] <= MAX_TOKEN_ID:
            why = f"outside the vocabulary of {uri} ({vocab_size} ids: 0 .. {vocab_size - 1})"
        else:
            why = f"larger than {MAX_TOKEN_ID}, the largest token id any runtime stores"
        return f"[{i}][{j}]", f"token id {row[j]} is {why}{tail}"
    return None


def context_fault(
    rows: Sequence[Sequence[int]], max_new_tokens: int, uri: str, max_positions: int | None
) -> str | None:
    """Why the longest prompt plus ``max_new_tokens`` cannot fit the checkpoint's context
    (``MAX_SEQUENCE_TOKENS`` when the checkpoint's context length is not known)."""
    longest = max(len(row) for row in rows)
    limit = MAX_SEQUENCE_TOKENS if max_positions is None else max_positions
    if longest + max_new_tokens <= limit:
        return None
    where = (
        f"the {max_positions} positions of {uri}"
        if max_positions is not None
        else f"{MAX_SEQUENCE_TOKENS} tokens, the most any sample may have when the context "
        f"length of {uri} is not known"
    )
    return f"{max_new_tokens} new tokens after the longest prompt ({longest} tokens) exceed {where}"
