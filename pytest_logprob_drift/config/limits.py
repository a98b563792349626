"""What execution can accept, known before anything executes.

Owns the generic limits that execution (the artifact store, torch and numpy generators, the
runtimes' embeddings) would otherwise hit only after planning succeeded, so that planning
refuses a config for the same reason and names the JSON path instead: an experiment id is a
directory name, seeds fit numpy and torch, token ids fit ``torch.long``, a sample fits a
context, a path fits a file system. Each limit is stated beside its constant below.

Checks a config's checkpoint against what it is handed: the built-in checkpoints (a URI with
a scheme, ``name://``) that the registered runtimes declare, by URI, whose vocabulary, context
and seed rule then apply; or a local checkpoint directory, whose ``config.json`` (a regular
file of at most ``CONFIG_JSON_LIMIT`` bytes) is read as JSON for its vocabulary and context,
and refused when it cannot be. Holds no checkpoint's limits and names no runtime record;
never imports torch or a runtime.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_logprob_drift.config.input_file import NotRegularInput, OversizedInput, read_input

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from pytest_logprob_drift.records import BuiltinCheckpoint

MAX_EXPERIMENT_ID_BYTES = 200
"""UTF-8 bytes of an experiment id: a directory name (255 bytes on common file systems)
with room for suffixes."""
MAX_JSON_INT = 2**64 - 1
"""The largest integer a config or prompt file may hold (``config.loader`` reads no integer
beyond it): the bound of every numeric command-line option that ends up in one."""
MAX_SEED = 2**32 - 1
"""numpy's seed range, which vLLM seeds with ``sampling.seed``."""
MAX_GENERATOR_SEED = 2**64 - 1
"""torch's ``Generator.manual_seed`` range (non-negative part), which every per-sample seed a
runtime derives from ``sampling.seed`` must fit: ``seed + index`` (vLLM's request seeds) and a
built-in checkpoint's declared ``seed * seed_multiplier + index``; a runtime that hashes the
seed to 63 bits (transformers) always fits."""
MAX_TOKEN_ID = 2**63 - 1
"""int64 (``torch.long``): the dtype of every runtime's token-id tensors."""
MAX_SEQUENCE_TOKENS = 1 << 20
"""Prompt plus new tokens of one sample when the checkpoint's context length is not known at
planning: the longest context windows of released models (about a million tokens). Beyond it
every runtime would allocate ``[samples, tokens]`` scores (and a synthetic model generate) for
nothing any checkpoint can attend to."""
MAX_VOCAB_SIZE = 2**31
"""The largest vocabulary a local checkpoint's config.json may declare: vLLM holds input ids
as int32 and the tokenizers library as 32-bit integers, so no runtime serves more ids."""
MAX_POSITIONS = MAX_TOKEN_ID
"""The largest ``max_position_embeddings`` a local checkpoint may declare: position ids are
``torch.long``."""
CONFIG_JSON_LIMIT = 16 << 20
"""The largest local checkpoint config.json planning reads (16 MiB; a real one is a few KB)."""


class CheckpointLimits:
    """What planning knows about a checkpoint (None: unknown). A plain class: a dataclass or
    NamedTuple costs more to create at import than ``plan`` spends planning a case."""

    __slots__ = ("max_positions", "vocab_size")

    def __init__(self, vocab_size: int | None = None, max_positions: int | None = None) -> None:
        self.vocab_size = vocab_size
        self.max_positions = max_positions


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


def seed_fault(seed: int, samples: int, checkpoint: BuiltinCheckpoint | None) -> str | None:
    """Why ``seed`` cannot seed ``samples`` samples: numpy's range, and torch's for every
    per-sample seed derived from it (``seed + index`` as vLLM derives them, and the built-in
    ``checkpoint``'s own rule, if it declares one)."""
    if seed > MAX_SEED:
        return f"{seed} is out of range: seeds must be 0 .. {MAX_SEED} (vLLM seeds numpy with it)"
    last = max(samples - 1, 0)
    derived = {"seed + index": seed + last}
    if checkpoint is not None and checkpoint.seed_multiplier is not None:
        rule = f"seed * {checkpoint.seed_multiplier} + index (how {checkpoint.uri} is sampled)"
        derived[rule] = seed * checkpoint.seed_multiplier + last
    for what, value in derived.items():
        if value > MAX_GENERATOR_SEED:  # no shipped rule gets here (MAX_SEED bounds them)
            return f"{seed} is out of range: {what} exceeds torch's generator range"
    return None


def checkpoint_limits(
    uri: str, builtin: Mapping[str, BuiltinCheckpoint]
) -> tuple[CheckpointLimits, str | None]:
    """What is known about checkpoint ``uri`` before execution, and why no runtime could
    serve it (None when one might). ``builtin``: the built-in checkpoints of the registered
    runtimes, by URI; a URI with one of their schemes must be one of them."""
    if "\0" in uri:
        return CheckpointLimits(), "contains a NUL character; no file system accepts it"
    known = builtin.get(uri)
    if known is not None:
        return CheckpointLimits(known.vocab_size, known.max_positions), None
    scheme = next(
        (c.scheme for c in builtin.values() if c.scheme and uri.startswith(c.scheme)), None
    )
    if scheme is not None:
        names = ", ".join(sorted(u for u in builtin if u.startswith(scheme)))
        return CheckpointLimits(), f"unknown checkpoint {uri!r} (known: {names})"
    fault = path_fault(uri)
    if fault is not None:
        return CheckpointLimits(), fault
    return _local_limits(Path(uri))


MAX_NAME_BYTES = 255
"""The longest file name (bytes) common file systems accept (``ENAMETOOLONG`` beyond)."""
MAX_PATH_BYTES = 4095
"""The longest path (bytes) Linux accepts (``PATH_MAX`` less its NUL)."""


def path_fault(path: str) -> str | None:
    """Why no file system would accept ``path`` (a name over 255 bytes, a path over 4095)."""
    encoded = os.fsencode(path)
    if len(encoded) > MAX_PATH_BYTES:
        return f"is {len(encoded)} bytes long; no file system accepts a path over 4095"
    longest = max(len(part) for part in encoded.split(b"/"))
    if longest > MAX_NAME_BYTES:
        return f"has a {longest}-byte name; no file system accepts a name over 255 bytes"
    return None


def _local_limits(directory: Path) -> tuple[CheckpointLimits, str | None]:
    """The vocabulary and context a local checkpoint's config.json declares (unknown when the
    directory or the file does not exist yet: execution says so), or why it cannot be read:
    not a regular file, over ``CONFIG_JSON_LIMIT``, not a JSON object, a size out of range."""
    config = directory / "config.json"
    try:
        data = read_input(config, CONFIG_JSON_LIMIT)
    except (FileNotFoundError, NotADirectoryError):
        return CheckpointLimits(), None
    except NotRegularInput:
        return CheckpointLimits(), f"{config}: not a regular file"
    except OversizedInput as exc:
        return CheckpointLimits(), _too_large(config, exc.size)
    except OSError as exc:
        return CheckpointLimits(), f"{config}: cannot be read ({exc.strerror})"
    try:
        document = json.loads(data)
    except json.JSONDecodeError as exc:
        return (
            CheckpointLimits(),
            f"{config}: not JSON (line {exc.lineno} column {exc.colno}: {exc.msg})",
        )
    except (ValueError, RecursionError) as exc:  # not UTF-8, a huge integer, deep nesting
        return CheckpointLimits(), f"{config}: not JSON ({exc.__class__.__name__})"
    if not isinstance(document, dict):
        return CheckpointLimits(), f"{config}: not a JSON object"
    nested = document.get("text_config")
    found: dict[str, int] = {}
    for prefix, section in (("", document), ("text_config.", nested)):
        if not isinstance(section, dict):
            continue
        for name, largest, what in _CONFIG_SIZES:
            value = section.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= largest:
                shown = (
                    json.dumps(value)[:40]
                    if isinstance(value, (int, float, str))
                    else type(value).__name__
                )
                return CheckpointLimits(), (
                    f"{config}: {prefix}{name} is {shown}; {what} is an integer 1 .. {largest}"
                )
            found.setdefault(name, value)
    return CheckpointLimits(found.get("vocab_size"), found.get("max_position_embeddings")), None


_CONFIG_SIZES = (
    ("vocab_size", MAX_VOCAB_SIZE, "a vocabulary size"),
    ("max_position_embeddings", MAX_POSITIONS, "a context length"),
)
"""The config.json fields planning checks a config against: name, largest value, meaning."""


def _too_large(config: Path, size: int) -> str:
    return f"{config}: {size} bytes; planning reads a config.json of at most {CONFIG_JSON_LIMIT}"


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
