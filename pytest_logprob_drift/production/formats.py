"""The formats an import reads, each turned into training steps of per-sample rows.

Owns what each framework writes and how it maps onto one token row per sample (the full
sequence, prompt and response, with each side's logprob of ``token_ids[t]`` at column ``t`` and
the active mask the contract's rule is applied on), and refusing, in one line naming the file
and the line or sample, every record that does not fit: a logprob array of another length than
its mask or tokens, a mask that is not 0/1, a response longer than its sequence, a record that
is not of the format asked for, an older NeMo-RL file without the token fields.

- **NeMo-RL** (``train_data_step<N>.jsonl``, GRPO's default dump; ``Logger.
  log_batched_dict_as_jsonl`` writes one row per sample of ``make_microbatch_iterator(1)``, so
  a 2-D field is ``[[...]]`` and a 1-D one ``[x]``, plus the logger's ``idx``): ``token_ids``,
  ``token_loss_mask``, ``sample_loss_mask``, ``generation_logprobs`` (the rollout),
  ``prev_logprobs`` (the trainer), ``input_lengths``; full sequences padded to the batch
  maximum, the logprob at ``t`` that of ``token_ids[t]``, column 0 is 0 by convention and never
  active. Active: ``token_loss_mask`` 1, ``sample_loss_mask`` 1, ``1 <= t < input_lengths``.
  A sample whose ``sample_loss_mask`` is 0 while its ``token_loss_mask`` is not was masked by
  the run (``grpo.seq_logprob_error_threshold`` writes its drift mask there before the log, or
  another reason: the log does not say which): its tokens are ``Row.masked``, never active.
  The step is the file name's. Other fields (``content``, ``rewards``, ``advantages``...) are
  skipped unread. Python's ``json`` writes NaN and Infinity as bare words: such a line is read
  again with the standard library.
- **slime** (``--save-debug-train-data`` / ``--dump-details DIR``'s train dumps, ``torch.save``
  dicts loaded with ``weights_only=True``; its rollout dumps need full unpickling and are never
  read), in either layout:

  * per rank, as slime's releases (up to v0.3.1) and miles write them
    (``train_data/{rollout_id}_{rank}.pt``): ``rollout_id`` (the step), ``rank`` and
    ``rollout_data``, the rank's share of the rollout as per-sample lists: ``tokens``,
    ``total_lengths``, ``response_lengths``, ``sample_indices``, response-aligned
    ``loss_masks``, ``rollout_log_probs`` and ``log_probs`` (the trainer's, only written when
    slime recomputed them: ``--get-mismatch-metrics``). The files of one ``rollout_id`` (given
    next to each other, as a directory's natural order puts them) make one step, its samples
    ordered by ``sample_indices``; a sample several ranks hold (tensor or pipeline parallel
    ranks of one data-parallel rank) is read once, and must be the same on each.
  * ``format_version`` 2 (slime's main branch, one file per rollout, ``train_data/<id>.pt``):
    ``rollout_id`` (the step), ``samples``, each with ``tokens`` (prompt and response),
    ``total_lengths``, ``response_lengths``, and response-aligned ``loss_masks``,
    ``rollout_log_probs`` and ``log_probs`` (the trainer), ``sample_index``.

  Active: ``loss_masks`` 1.
- **neutral** (``jsonl``: one JSON object per sample; Parquet with the same columns through
  the ``parquet`` extra): ``step``, ``sample``, ``token_ids`` (prompt and response),
  ``prompt_length``, and response-aligned ``rollout_logprobs``, ``training_logprobs``,
  ``mask`` (``prompt_length + len(mask) == len(token_ids)``). A step's samples are written
  together (one step at a time is held); a step that reappears later is refused.

NaN or infinity at an inactive position is kept as read and never judged; at an active one the
verdict makes the step INVALID_ARTIFACT. Knows nothing about seals, verdicts or the store.
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import io
import json
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import torch

from pytest_logprob_drift.check.imported_check import rank_files_sha256
from pytest_logprob_drift.numerics.framework_figures import SlimeBatch, slime_denominators
from pytest_logprob_drift.production.sources import (
    NEUTRAL_DOCS,
    ImportInputError,
    InputFile,
    nemo_rl_step,
)
from pytest_logprob_drift.store.documents import ImportedRow, ImportFormat, InputDigest
from pytest_logprob_drift.tensorio import inflation_problem

UNSET = msgspec.UNSET
_Unset = msgspec.UnsetType
MAX_TOKEN_ID = 2**63 - 1


@dataclass(slots=True, kw_only=True)
class Row:
    """One sample on its own token row: ids, both sides' logprobs (float64, 0 where the
    format logs none), the active mask, where its response starts, where it came from."""

    token_ids: torch.Tensor
    rollout: torch.Tensor
    training: torch.Tensor
    active: torch.Tensor
    start: int
    source: ImportedRow
    masked: torch.Tensor | None = None
    """The tokens the run itself masked out (NeMo-RL: ``sample_loss_mask`` 0 while
    ``token_loss_mask`` is 1), judged apart from the verdict; None when none."""


@dataclass(slots=True, kw_only=True)
class Step:
    """One training step: its rows in source order, the inputs they came from (indices into
    the import's input list) and the SHA-256 of the step's own source bytes."""

    step: int
    rows: list[Row] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    digest: str = ""
    input_digests: dict[int, InputDigest] = field(default_factory=dict)
    """Per member of ``inputs``: the SHA-256 and size of the step's own bytes of it."""
    slime: SlimeBatch | None = None
    """What slime's own drift figure needs (a slime step only)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Format:
    """A format's name, the source fields each side's logprobs come from, the rule of its
    active mask, and every field it reads."""

    name: ImportFormat
    rollout: str
    training: str
    active: str
    fields: tuple[str, ...]


NEMO_RL = Format(
    name="nemo-rl",
    rollout="generation_logprobs",
    training="prev_logprobs",
    active="token_loss_mask == 1 and sample_loss_mask == 1 and 1 <= t < input_lengths",
    fields=(
        "token_ids",
        "token_loss_mask",
        "sample_loss_mask",
        "generation_logprobs",
        "prev_logprobs",
        "input_lengths",
        "idx",
    ),
)
SLIME = Format(
    name="slime",
    rollout="rollout_log_probs",
    training="log_probs",
    active="loss_masks == 1 (response-aligned, after total_lengths - response_lengths)",
    fields=(
        "format_version",
        "rollout_id",
        "samples[].tokens",
        "samples[].total_lengths",
        "samples[].response_lengths",
        "samples[].loss_masks",
        "samples[].rollout_log_probs",
        "samples[].log_probs",
        "samples[].sample_index",
        "rank",
        "rollout_data.tokens",
        "rollout_data.total_lengths",
        "rollout_data.response_lengths",
        "rollout_data.loss_masks",
        "rollout_data.rollout_log_probs",
        "rollout_data.log_probs",
        "rollout_data.sample_indices",
    ),
)
SLIME_RANK_FIELDS = (
    "tokens",
    "total_lengths",
    "response_lengths",
    "loss_masks",
    "rollout_log_probs",
    "log_probs",
    "sample_indices",
)
"""The per-sample lists of a per-rank slime dump's ``rollout_data`` that are read."""
SLIME_LOG_PROBS_FLAG = "--get-mismatch-metrics"
"""The slime flag that makes it recompute the trainer's ``log_probs`` (and so dump them): by
default (one training step per rollout, no KL term, no TIS) slime reuses the training forward
pass and ``rollout_data`` holds no ``log_probs``."""
NEUTRAL = Format(
    name="jsonl",
    rollout="rollout_logprobs",
    training="training_logprobs",
    active="mask == 1 (response-aligned, after prompt_length)",
    fields=(
        "step",
        "sample",
        "token_ids",
        "prompt_length",
        "rollout_logprobs",
        "training_logprobs",
        "mask",
    ),
)
FORMATS: Mapping[str, Format] = {f.name: f for f in (NEMO_RL, SLIME, NEUTRAL)}


# --------------------------------------------------------------------------- shared checks


class _Where:
    """Where a record is, for its refusal: the file and the line or the sample."""

    __slots__ = ("file", "line", "sample")

    def __init__(self, file: object, *, line: int | None = None, sample: int | None = None):
        self.file, self.line, self.sample = file, line, sample

    def error(self, message: str) -> ImportInputError:
        return ImportInputError(str(self.file), message, line=self.line, sample=self.sample)


def _tensor(values: Any, code: str, dtype: torch.dtype) -> torch.Tensor:
    """``values`` as a 1-D tensor of ``dtype`` (a JSON list through ``array.array``, several
    times faster than ``torch.as_tensor`` of a list; a tensor as it is)."""
    if isinstance(values, list):
        return (
            torch.frombuffer(array.array(code, values), dtype=dtype)
            if values
            else (torch.zeros(0, dtype=dtype))
        )
    return torch.as_tensor(values, dtype=dtype)


def _ids(values: Any, name: str, where: _Where) -> torch.Tensor:
    try:
        ids = _tensor(values, "q", torch.int64)
    except (OverflowError, RuntimeError, TypeError, ValueError) as exc:
        raise where.error(f"{name}: not token ids ({exc})") from None
    if ids.dim() != 1:
        raise where.error(f"{name}: expected one list of token ids, got {ids.dim()} dimensions")
    if ids.numel() and int(ids.min()) < 0:
        raise where.error(f"{name}: negative token id {int(ids.min())}")
    return ids


def _floats(values: Any, name: str, where: _Where) -> torch.Tensor:
    try:
        scores = _tensor(values, "d", torch.float64)
    except (OverflowError, RuntimeError, TypeError, ValueError) as exc:
        raise where.error(f"{name}: not numbers ({exc})") from None
    if scores.dim() != 1:
        raise where.error(f"{name}: expected one list of numbers, got {scores.dim()} dimensions")
    return scores


def _mask(values: Any, name: str, where: _Where) -> torch.Tensor:
    mask = _floats(values, name, where)
    bad = (mask != 0) & (mask != 1)
    if bool(bad.any()):
        at = int(bad.nonzero()[0][0])
        raise where.error(f"{name} holds {float(mask[at])!r} at position {at}: a mask is 0 or 1")
    return mask == 1


def _same_length(
    reference: tuple[str, torch.Tensor], others: Sequence[tuple[str, torch.Tensor]], where: _Where
) -> None:
    name, tensor = reference
    for other, values in others:
        if values.numel() != tensor.numel():
            raise where.error(
                f"{other} has {values.numel()} values, {name} has {tensor.numel()}: "
                "each logprob belongs to one token"
            )


def _response_row(
    *,
    ids: torch.Tensor,
    prompt: int,
    rollout: torch.Tensor,
    training: torch.Tensor,
    mask: torch.Tensor,
    source: ImportedRow,
) -> Row:
    """A row from response-aligned logprobs and mask placed after ``prompt`` tokens."""
    length = ids.numel()
    full_rollout = torch.zeros(length, dtype=torch.float64)
    full_training = torch.zeros(length, dtype=torch.float64)
    active = torch.zeros(length, dtype=torch.bool)
    full_rollout[prompt:] = rollout
    full_training[prompt:] = training
    active[prompt:] = mask
    return Row(
        token_ids=ids,
        rollout=full_rollout,
        training=full_training,
        active=active,
        start=prompt,
        source=source,
    )


_TOO_DEEP = (
    "a member is nested deeper than the JSON decoders go (Python's recursion limit); no "
    "format nests its fields more than a few levels"
)


def _line_object(line: bytes, kind: type[Any], decoder: Any, where: _Where, own: str) -> Any:
    """A JSONL line of format ``own`` decoded into ``kind`` (msgspec; unknown members
    skipped): a line with NaN or Infinity, which Python's ``json`` writes and msgspec refuses,
    is read again with the standard library. A member of the wrong type is refused with its
    JSON path (and the format the line looks like, when it is another)."""
    try:
        return decoder.decode(line)
    except msgspec.ValidationError as exc:
        raise where.error(_validation(exc) + _other_format(_keys(line), own)) from None
    except msgspec.DecodeError:
        pass
    except RecursionError:
        raise where.error(_TOO_DEEP) from None
    try:
        value = json.loads(line)
    except RecursionError:
        raise where.error(_TOO_DEEP) from None
    except ValueError as exc:
        raise where.error(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise where.error(f"not a JSON object but {type(value).__name__}")
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        raise where.error(_validation(exc) + _other_format(set(value), own)) from None


def _validation(exc: msgspec.ValidationError) -> str:
    message, marker, path = str(exc).rpartition(" - at `")
    return f"{path.rstrip('`')}: {message}" if marker else str(exc)


def _keys(line: bytes) -> set[str]:
    """The member names of a JSON object line (only to word a refusal)."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return set()
    return set(value) if isinstance(value, dict) else set()


def _other_format(keys: set[str], own: str) -> str:
    """A hint naming the format whose fields ``keys`` has, when it is not ``own``."""
    if own != "jsonl" and {"rollout_logprobs", "training_logprobs"} <= keys:
        return " (it looks like the neutral format: --format jsonl)"
    if own != "nemo-rl" and {"generation_logprobs", "prev_logprobs"} & keys:
        return " (it looks like NeMo-RL's train_data_step file: --format nemo-rl)"
    return ""


def _not_zip(file: InputFile, fmt: str) -> None:
    if file.is_zip:
        raise ImportInputError(
            file.path,
            f"a zip archive (a torch.save file), not the {fmt} JSONL format: --format slime?",
        )


# --------------------------------------------------------------------------- NeMo-RL


class _NemoRow(msgspec.Struct):
    """The members of a NeMo-RL train_data row that are read (the others are skipped)."""

    token_ids: list[list[int]] | _Unset = UNSET
    token_loss_mask: list[list[float]] | _Unset = UNSET
    sample_loss_mask: list[float] | _Unset = UNSET
    generation_logprobs: list[list[float]] | _Unset = UNSET
    prev_logprobs: list[list[float]] | _Unset = UNSET
    input_lengths: list[int] | _Unset = UNSET
    idx: int | _Unset = UNSET


_NEMO_DECODER = msgspec.json.Decoder(_NemoRow)
_NEMO_TOKEN_FIELDS = ("token_ids", "token_loss_mask", "sample_loss_mask")
_NEMO_LOGPROB_FIELDS = ("generation_logprobs", "prev_logprobs", "input_lengths")


def _nemo_one(row: _NemoRow, name: str, where: _Where) -> Any:
    value = getattr(row, name)
    if len(value) != 1:
        raise where.error(
            f"{name} holds {len(value)} rows, not one (NeMo-RL's logger writes each sample's "
            "fields as a batch of one: [[...]] or [x])"
        )
    return value[0]


def _nemo_missing(row: _NemoRow, line: bytes, where: _Where) -> None:
    missing = [n for n in (*_NEMO_TOKEN_FIELDS, *_NEMO_LOGPROB_FIELDS) if getattr(row, n) is UNSET]
    if not missing:
        return
    present = [n for n in (*_NEMO_TOKEN_FIELDS, *_NEMO_LOGPROB_FIELDS) if n not in missing]
    if not present:
        raise where.error(
            "not a NeMo-RL train_data row: none of its fields "
            f"({', '.join((*_NEMO_TOKEN_FIELDS, *_NEMO_LOGPROB_FIELDS))}) is there; does "
            f"--format nemo-rl match the file?{_other_format(_keys(line), 'nemo-rl')}"
        )
    if set(missing) <= set(_NEMO_TOKEN_FIELDS):
        raise where.error(
            f"no {', '.join(missing)}: written by an older NeMo-RL that logged no token fields; "
            "its logprobs cannot be placed on tokens or masked (a current NeMo-RL's GRPO logs "
            "token_ids, token_loss_mask and sample_loss_mask in train_data_step<N>.jsonl)"
        )
    raise where.error(f"missing NeMo-RL field(s) {', '.join(missing)}")


def _nemo_row(row: _NemoRow, line: bytes, where: _Where, source: ImportedRow) -> Row:
    _nemo_missing(row, line, where)
    ids = _ids(_nemo_one(row, "token_ids", where), "token_ids", where)
    token_mask = _mask(_nemo_one(row, "token_loss_mask", where), "token_loss_mask", where)
    sample_masks = _mask(row.sample_loss_mask, "sample_loss_mask", where)
    if sample_masks.numel() != 1:
        raise where.error(f"sample_loss_mask holds {sample_masks.numel()} values, not one ([x])")
    sample_mask = bool(sample_masks[0])
    rollout = _floats(_nemo_one(row, "generation_logprobs", where), "generation_logprobs", where)
    training = _floats(_nemo_one(row, "prev_logprobs", where), "prev_logprobs", where)
    _same_length(
        ("token_ids", ids),
        (("token_loss_mask", token_mask), ("generation_logprobs", rollout)),
        where,
    )
    _same_length(("token_ids", ids), (("prev_logprobs", training),), where)
    length = _nemo_one(row, "input_lengths", where)
    if length < 0 or length > ids.numel():
        raise where.error(
            f"input_lengths {length} is longer than its sequence ({ids.numel()} token_ids)"
            if length > 0
            else f"input_lengths {length} is negative"
        )
    beyond = token_mask[length:]
    if bool(beyond.any()):
        at = length + int(beyond.nonzero()[0][0])
        raise where.error(f"token_loss_mask is 1 at position {at}, beyond input_lengths {length}")
    active = token_mask.clone()
    active[:1] = False  # column 0: no logprob (0 by NeMo-RL's convention)
    masked = None
    if not sample_mask:
        masked = active.clone() if bool(active.any()) else None
        active[:] = False
    first = token_mask.nonzero()
    start = int(first[0][0]) if first.numel() else length
    return Row(
        token_ids=ids,
        rollout=rollout,
        training=training,
        active=active,
        start=start,
        source=source,
        masked=masked,
    )


@dataclass(slots=True, kw_only=True)
class _NemoRead:
    """One NeMo-RL line as read: its fields' shapes checked, its values not yet (a step's
    values are checked together: ``_nemo_step_rows``)."""

    ids: array.array[int]
    mask: array.array[float]
    rollout: array.array[float]
    training: array.array[float]
    length: int
    sample_mask: bool
    where: _Where
    source: ImportedRow
    idx: int | _Unset


def _nemo_read(row: _NemoRow, line: bytes, where: _Where, source: ImportedRow) -> _NemoRead:
    """``row``'s fields as arrays when their shapes are those ``_nemo_row`` takes; else the
    line's refusal, as ``_nemo_row`` words it."""
    read = None
    with contextlib.suppress(OverflowError, TypeError, ValueError):
        read = _nemo_fast(row, where, source)
    if read is None:
        _nemo_row(row, line, where, source)  # raises the line's refusal
        raise AssertionError(f"{where.file}:{where.line}: a NeMo-RL row refused, then read")
    return read


def _nemo_fast(row: _NemoRow, where: _Where, source: ImportedRow) -> _NemoRead | None:
    """The checks of ``_nemo_row`` that need no scan of a row's values (None when one fails:
    ``_nemo_row`` then words the refusal)."""
    ids, mask = row.token_ids, row.token_loss_mask
    rollout, training = row.generation_logprobs, row.prev_logprobs
    samples, lengths = row.sample_loss_mask, row.input_lengths
    if (
        isinstance(ids, _Unset)
        or isinstance(mask, _Unset)
        or isinstance(rollout, _Unset)
        or isinstance(training, _Unset)
        or isinstance(samples, _Unset)
        or isinstance(lengths, _Unset)
    ):
        return None
    if not len(ids) == len(mask) == len(rollout) == len(training) == len(samples) == len(lengths):
        return None
    if len(ids) != 1 or samples[0] not in (0.0, 1.0):
        return None
    width, length = len(ids[0]), lengths[0]
    if not (len(mask[0]) == len(rollout[0]) == len(training[0]) == width) or not (
        0 <= length <= width
    ):
        return None
    return _NemoRead(
        ids=array.array("q", ids[0]),
        mask=array.array("d", mask[0]),
        rollout=array.array("d", rollout[0]),
        training=array.array("d", training[0]),
        length=length,
        sample_mask=samples[0] == 1.0,
        where=where,
        source=source,
        idx=row.idx,
    )


def _column(parts: Sequence[array.array[Any]], code: str, dtype: torch.dtype) -> torch.Tensor:
    """The rows' arrays end to end, as one tensor (one copy)."""
    whole = array.array(code)
    for part in parts:
        whole.extend(part)
    return torch.frombuffer(whole, dtype=dtype) if whole else torch.zeros(0, dtype=dtype)


def _nemo_step_rows(reads: Sequence[_NemoRead]) -> list[Row]:
    """The rows of a step's lines, their values checked together (a negative token id, a mask
    that is not 0/1, a token_loss_mask 1 beyond input_lengths: the first such line's refusal,
    as ``_nemo_row`` words it) and placed as ``_nemo_row`` places them."""
    if not reads:
        return []
    widths = [len(r.ids) for r in reads]
    count = torch.tensor(widths, dtype=torch.int64)
    ids = _column([r.ids for r in reads], "q", torch.int64)
    mask = _column([r.mask for r in reads], "d", torch.float64)
    row_of = torch.repeat_interleave(torch.arange(len(reads)), count)
    offsets = torch.cumsum(count, 0) - count
    position = torch.arange(ids.numel()) - offsets[row_of]
    ones = mask == 1
    lengths = torch.tensor([r.length for r in reads], dtype=torch.int64)
    bad = (ids < 0) | ((mask != 0) & ~ones) | (ones & (position >= lengths[row_of]))
    if bool(bad.any()):
        read = reads[int(row_of[int(bad.nonzero()[0][0])])]
        _nemo_row(_nemo_decoded(read), b"", read.where, read.source)  # raises its refusal
        raise AssertionError(f"{read.where.file}:{read.where.line}: a value refused, then read")
    rollout = _column([r.rollout for r in reads], "d", torch.float64)
    training = _column([r.training for r in reads], "d", torch.float64)
    counted = ones & (position >= 1)  # column 0: no logprob (0 by NeMo-RL's convention)
    samples = torch.tensor([r.sample_mask for r in reads], dtype=torch.bool)
    active = counted & samples[row_of]
    none = torch.iinfo(torch.int64).max
    first = torch.full((len(reads),), none, dtype=torch.int64)
    first.scatter_reduce_(0, row_of, torch.where(ones, position, none), "amin")
    starts = torch.where(first == none, lengths, first).tolist()
    rows: list[Row] = []
    at = 0
    for read, width, start in zip(reads, widths, starts, strict=True):
        end = at + width
        masked = None
        if not read.sample_mask and bool(counted[at:end].any()):
            masked = counted[at:end]
        rows.append(
            Row(
                token_ids=ids[at:end],
                rollout=rollout[at:end],
                training=training[at:end],
                active=active[at:end],
                start=start,
                source=read.source,
                masked=masked,
            )
        )
        at = end
    return rows


def _nemo_decoded(read: _NemoRead) -> _NemoRow:
    """``read`` as the decoded row it came from (to word a refusal with ``_nemo_row``)."""
    return _NemoRow(
        token_ids=[read.ids.tolist()],
        token_loss_mask=[read.mask.tolist()],
        sample_loss_mask=[1.0 if read.sample_mask else 0.0],
        generation_logprobs=[read.rollout.tolist()],
        prev_logprobs=[read.training.tolist()],
        input_lengths=[read.length],
        idx=read.idx,
    )


def _open(path: Path, opened: list[InputFile]) -> tuple[int, InputFile]:
    file = InputFile(path)
    opened.append(file)
    return len(opened) - 1, file


def read_nemo_rl(paths: Sequence[Path], opened: list[InputFile]) -> Iterator[Step]:
    """One step per ``train_data_step<N>.jsonl`` (files in step order)."""
    for path in paths:
        index, file = _open(path, opened)
        _not_zip(file, "NeMo-RL")
        step = Step(step=nemo_rl_step(file.path), inputs=[index])
        reads: list[_NemoRead] = []
        for number, line in file.lines():
            where = _Where(file.path, line=number)
            try:
                row = _line_object(line, _NemoRow, _NEMO_DECODER, where, "nemo-rl")
                sample = row.idx if isinstance(row.idx, int) and row.idx >= 0 else None
                source = ImportedRow(input=index, line=number, sample=sample)
                reads.append(_nemo_read(row, line, where, source))
            except ImportInputError:
                _nemo_step_rows(reads)  # an earlier line's refusal comes first
                raise
        step.rows = _nemo_step_rows(reads)
        del reads
        if not step.rows:
            raise ImportInputError(file.path, "holds no rows: nothing to import")
        record = file.record()
        step.digest = record.sha256
        step.input_digests[index] = InputDigest(sha256=record.sha256, size=record.size)
        yield step


# --------------------------------------------------------------------------- slime


def _torch_load(file: InputFile) -> Any:
    """A slime train dump: ``torch.load(..., weights_only=True)`` of the file's bytes."""
    if not file.is_zip:
        raise ImportInputError(
            file.path,
            "not a torch.save file (slime's train dumps are zip archives): --format nemo-rl "
            "or jsonl?",
        )
    data = file.read_all()
    inflated = inflation_problem(data)
    if inflated is not None:
        raise ImportInputError(file.path, inflated)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ImportInputError(
            file.path,
            "does not load with torch.load(weights_only=True), the only way a dump is read "
            "(slime's rollout dumps, rollout_data/<id>.pt, need full unpickling and are never "
            f"read: pass its train_data/<id>.pt): {reason[:300]}",
        ) from None


def _sample_field(sample: Mapping[str, Any], name: str, where: _Where) -> Any:
    if name not in sample or sample[name] is None:
        hint = (
            " (the rollout returned no logprobs: slime records rollout_log_probs only when its "
            "engine returns them)"
            if name == "rollout_log_probs"
            else ""
        )
        raise where.error(f"no {name}{hint}")
    return sample[name]


def _integer(value: Any, name: str, where: _Where) -> int:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = int(value.item())
    if isinstance(value, bool) or not isinstance(value, int):
        raise where.error(f"{name} is {type(value).__name__}, not an integer")
    return value


def _slime_row(sample: Any, where: _Where, source: ImportedRow) -> Row:
    if not isinstance(sample, dict):
        raise where.error(f"not a sample dict but {type(sample).__name__}")
    tokens = _sample_field(sample, "tokens", where)
    if isinstance(tokens, torch.Tensor) and tokens.is_floating_point():
        raise where.error(f"tokens has dtype {tokens.dtype}, not token ids")
    ids = _ids(tokens, "tokens", where)
    total = _integer(_sample_field(sample, "total_lengths", where), "total_lengths", where)
    response = _integer(_sample_field(sample, "response_lengths", where), "response_lengths", where)
    if total != ids.numel():
        raise where.error(f"tokens has {ids.numel()} ids, total_lengths says {total}")
    if response < 0 or response > total:
        raise where.error(
            f"response_lengths {response} is longer than its sequence (total_lengths {total})"
            if response > total
            else f"response_lengths {response} is negative"
        )
    mask = _mask(_sample_field(sample, "loss_masks", where), "loss_masks", where)
    rollout = _floats(_sample_field(sample, "rollout_log_probs", where), "rollout_log_probs", where)
    training = _floats(_sample_field(sample, "log_probs", where), "log_probs", where)
    if mask.numel() != response:
        raise where.error(f"loss_masks has {mask.numel()} values, response_lengths is {response}")
    _same_length(
        ("loss_masks", mask), (("rollout_log_probs", rollout), ("log_probs", training)), where
    )
    return _response_row(
        ids=ids,
        prompt=total - response,
        rollout=rollout,
        training=training,
        mask=mask,
        source=source,
    )


def read_slime(paths: Sequence[Path], opened: list[InputFile]) -> Iterator[Step]:
    """One step per ``rollout_id``: a ``format_version`` 2 dump, or the per-rank dumps of one
    rollout (``_RankDumps``)."""
    ranks = _RankDumps()
    for path in paths:
        index, file = _open(path, opened)
        dump = _torch_load(file)
        if _is_rank_dump(dump):
            yield from ranks.add(dump, file, index)
            continue
        yield from ranks.finish()
        if not isinstance(dump, dict) or "samples" not in dump:
            raise ImportInputError(
                file.path,
                "not a slime train dump (a dict with rollout_id, rank and rollout_data, as "
                "slime's releases write train_data/{rollout_id}_{rank}.pt, or one with "
                "format_version, rollout_id and samples)",
            )
        version = dump.get("format_version")
        if version != 2:
            raise ImportInputError(
                file.path, f"slime train dump format_version {version!r}: only 2 is read"
            )
        step_id = _integer(dump.get("rollout_id"), "rollout_id", _Where(file.path))
        if step_id < 0:
            raise ImportInputError(file.path, f"rollout_id {step_id} is negative")
        samples = dump["samples"]
        if not isinstance(samples, list) or not samples:
            raise ImportInputError(file.path, "samples is empty: nothing to import")
        record = file.record()
        step = Step(step=step_id, inputs=[index], digest=record.sha256)
        step.input_digests[index] = InputDigest(sha256=record.sha256, size=record.size)
        groups: list[tuple[int | None, float | None]] = []
        for position, sample in enumerate(samples):
            where = _Where(file.path, sample=position)
            sample_index = sample.get("sample_index") if isinstance(sample, dict) else None
            source = ImportedRow(
                input=index,
                index=position,
                sample=sample_index
                if isinstance(sample_index, int) and sample_index >= 0
                else None,
            )
            step.rows.append(_slime_row(sample, where, source))
            groups.append(_slime_group(sample, "rollout_ids", "rollout_mask_sums", where))
        shards = dump.get("dp_shards")
        shard = shards[0] if isinstance(shards, list) and shards else {}
        sizes = shard.get("global_batch_sizes") if isinstance(shard, dict) else None
        step.slime = _slime_batch(step.rows, groups, sizes, _Where(file.path))
        del dump, samples
        yield step
    yield from ranks.finish()


def _slime_group(
    sample: Mapping[str, Any], group: str, total: str, where: _Where
) -> tuple[int | None, float | None]:
    """A sample's rollout group (``rollout_ids``) and the loss-mask total slime recorded for
    that group (``rollout_mask_sums``), each None when the dump has none."""
    raw = sample.get(group)
    rollout = None if raw is None else _integer(raw, group, where)
    value = sample.get(total)
    if value is None:
        return rollout, None
    try:
        recorded = float(value)
    except (TypeError, ValueError, RuntimeError):
        raise where.error(f"{total} is {type(value).__name__}, not a number") from None
    return rollout, recorded


def _slime_batch(
    rows: Sequence[Row],
    groups: Sequence[tuple[int | None, float | None]],
    sizes: Any,
    where: _Where,
) -> SlimeBatch:
    """The step's ``SlimeBatch``: each row's denominator and the one training step's global
    batch size (``global_batch_sizes`` of one entry; none when it lists several steps; the
    number of rollout groups when the dump has none)."""
    if sizes is not None and not isinstance(sizes, (list, tuple)):
        raise where.error(f"global_batch_sizes is {type(sizes).__name__}, not a list")
    size: int | None
    if sizes is None:
        size = len({g if g is not None else -1 - i for i, (g, _) in enumerate(groups)})
    elif len(sizes) == 1:
        size = _integer(sizes[0], "global_batch_sizes[0]", where)
    else:
        size = None
    return SlimeBatch(
        denominators=slime_denominators(
            [float(r.active.sum()) for r in rows],
            [g for g, _ in groups],
            [t for _, t in groups],
        ),
        global_batch_size=size,
    )


def _is_rank_dump(dump: Any) -> bool:
    """Whether ``dump`` is a per-rank dump (``{rollout_id, rank, rollout_data}``)."""
    return isinstance(dump, dict) and "rollout_data" in dump and "samples" not in dump


@dataclass(slots=True, kw_only=True)
class _RankSample:
    """One sample of a per-rank dump: its fields as read, the file and position it came
    from."""

    values: dict[str, Any]
    input: int
    position: int
    file: Path


class _RankDumps:
    """The per-rank dumps of the rollout being read, merged into its step when a file of
    another rollout (or the end) comes."""

    def __init__(self) -> None:
        self.rollout: int | None = None
        self.first: Path | None = None
        self.ranks: dict[int, Path] = {}
        self.inputs: list[int] = []
        self.digests: list[InputDigest] = []
        self.samples: dict[int, _RankSample] = {}
        self.sizes: Any = None
        self.done: dict[int, Path] = {}

    def add(self, dump: dict[str, Any], file: InputFile, index: int) -> Iterator[Step]:
        where = _Where(file.path)
        rollout = _integer(dump.get("rollout_id"), "rollout_id", where)
        rank = _integer(dump.get("rank"), "rank", where)
        if rollout < 0 or rank < 0:
            raise where.error(f"{'rollout_id' if rollout < 0 else 'rank'} is negative")
        if rollout != self.rollout:
            yield from self.finish()
            if rollout in self.done:
                raise where.error(
                    f"rollout_id {rollout} again, after other rollouts (first in "
                    f"{self.done[rollout]}): give each rollout's rank files next to each other "
                    "(a train_data directory lists them so)"
                )
            self.rollout, self.first = rollout, file.path
        if rank in self.ranks:
            raise where.error(
                f"rank {rank} of rollout_id {rollout} again (also {self.ranks[rank]})"
            )
        self.ranks[rank] = file.path
        self.inputs.append(index)
        record = file.record()
        self.digests.append(InputDigest(sha256=record.sha256, size=record.size))
        data = dump["rollout_data"]
        if not isinstance(data, dict):
            raise where.error(f"rollout_data is {type(data).__name__}, not a dict")
        if self.sizes is None:
            self.sizes = data.get("global_batch_sizes")
        for position, values in enumerate(_rank_samples(data, where)):
            self._merge(_RankSample(values=values, input=index, position=position, file=file.path))

    def _merge(self, sample: _RankSample) -> None:
        key = sample.values["sample_indices"]
        held = self.samples.get(key)
        if held is None:
            self.samples[key] = sample
            return
        where = _Where(sample.file, sample=sample.position)
        for name in SLIME_RANK_FIELDS:
            a, b = held.values.get(name), sample.values.get(name)
            if a is None or b is None:
                continue
            if not _same_value(a, b):
                raise where.error(
                    f"sample_indices {key}: {name} differs from the same sample in "
                    f"{held.file} (ranks of one data-parallel rank hold the same samples; a "
                    "context-parallel rank holds a slice: dump with context parallelism off)"
                )
        if held.values.get("log_probs") is None and sample.values.get("log_probs") is not None:
            self.samples[key] = sample  # the last pipeline stage's copy holds log_probs

    def finish(self) -> Iterator[Step]:
        """The step of the rollout read so far (nothing when none)."""
        if self.rollout is None:
            return
        rollout, first = self.rollout, self.first
        assert first is not None
        self.done[rollout] = first
        step = Step(step=rollout, inputs=list(self.inputs))
        step.input_digests = dict(zip(self.inputs, self.digests, strict=True))
        step.digest = rank_files_sha256(d.sha256 for d in self.digests)
        groups: list[tuple[int | None, float | None]] = []
        for key in sorted(self.samples):
            sample = self.samples[key]
            where = _Where(sample.file, sample=sample.position)
            groups.append(_slime_group(sample.values, "rollout_ids", "rollout_mask_sums", where))
            if sample.values.get("log_probs") is None:
                raise where.error(
                    f"no log_probs in rollout_data (rollout_id {rollout}): slime dumps the "
                    f"trainer's logprobs only when it recomputes them; run it with "
                    f"{SLIME_LOG_PROBS_FLAG}"
                )
            source = ImportedRow(input=sample.input, index=sample.position, sample=key)
            step.rows.append(_slime_row(sample.values, where, source))
        step.slime = _slime_batch(step.rows, groups, self.sizes, _Where(first))
        self.rollout, self.first, self.sizes = None, None, None
        self.ranks, self.inputs, self.digests, self.samples = {}, [], [], {}
        yield step


def _rank_samples(data: Mapping[str, Any], where: _Where) -> Iterator[dict[str, Any]]:
    """The per-sample values of a rank's ``rollout_data`` (``log_probs`` None where the rank
    holds none)."""
    lists: dict[str, Sequence[Any]] = {}
    for name in SLIME_RANK_FIELDS:
        value = data.get(name)
        if value is None:
            if name == "log_probs":
                continue
            raise where.error(
                f"rollout_data has no {name}"
                + (
                    " (the rollout returned no logprobs: slime records rollout_log_probs only "
                    "when its engine returns them)"
                    if name == "rollout_log_probs"
                    else ""
                )
            )
        if not isinstance(value, (list, tuple)):
            raise where.error(f"rollout_data.{name} is {type(value).__name__}, not a list")
        lists[name] = value
    count = len(lists["tokens"])
    for name, column in lists.items():
        if len(column) != count:
            raise where.error(
                f"rollout_data.{name} has {len(column)} entries, tokens has {count}: one per sample"
            )
    if not count:
        raise where.error("rollout_data holds no samples: nothing to import")
    groups = {
        name: data[name]
        for name in ("rollout_ids", "rollout_mask_sums")
        if isinstance(data.get(name), (list, tuple, torch.Tensor)) and len(data[name]) == count
    }
    for position in range(count):
        sample: dict[str, Any] = {name: lists[name][position] for name in lists}
        sample.update({name: column[position] for name, column in groups.items()})
        raw = sample["sample_indices"]
        key = None if raw is None else _integer(raw, f"sample_indices[{position}]", where)
        if key is None or key < 0:
            raise where.error(
                f"sample_indices[{position}] is {key!r}: without a sample's index the ranks' "
                "samples cannot be ordered or told apart"
            )
        sample["sample_indices"] = key
        sample.setdefault("log_probs", None)
        yield sample


def _same_value(a: Any, b: Any) -> bool:
    """Whether two values of one sample field are equal (tensors bit for bit, NaN included)."""
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        return bool(a == b)
    x, y = torch.as_tensor(a), torch.as_tensor(b)
    if x.shape != y.shape:
        return False
    if x.is_floating_point() and y.is_floating_point():
        return bool(((x == y) | (x.isnan() & y.isnan())).all())
    return bool(torch.equal(x, y))


# --------------------------------------------------------------------------- neutral


class _NeutralRow(msgspec.Struct):
    """One sample of the neutral format (other members are skipped)."""

    step: int | _Unset = UNSET
    sample: int | _Unset = UNSET
    token_ids: list[int] | _Unset = UNSET
    prompt_length: int | _Unset = UNSET
    rollout_logprobs: list[float] | _Unset = UNSET
    training_logprobs: list[float] | _Unset = UNSET
    mask: list[float | bool] | _Unset = UNSET


_NEUTRAL_DECODER = msgspec.json.Decoder(_NeutralRow)


def _neutral_row(row: _NeutralRow, keys: Any, where: _Where, source: ImportedRow) -> Row:
    missing = [n for n in NEUTRAL.fields if getattr(row, n) is UNSET]
    if missing:
        if len(missing) == len(NEUTRAL.fields):
            raise where.error(
                f"not a row of the neutral format ({NEUTRAL_DOCS}): none of its fields is there"
                f"{_other_format(keys(), 'jsonl')}"
            )
        raise where.error(
            f"missing field(s) {', '.join(missing)} of the neutral format ({NEUTRAL_DOCS})"
            f"{_other_format(keys(), 'jsonl')}"
        )
    ids = _ids(row.token_ids, "token_ids", where)
    mask = _mask(row.mask, "mask", where)
    rollout = _floats(row.rollout_logprobs, "rollout_logprobs", where)
    training = _floats(row.training_logprobs, "training_logprobs", where)
    _same_length(
        ("mask", mask), (("rollout_logprobs", rollout), ("training_logprobs", training)), where
    )
    prompt = row.prompt_length
    assert isinstance(prompt, int)
    if prompt < 0:
        raise where.error(f"prompt_length {prompt} is negative")
    if prompt + mask.numel() != ids.numel():
        longer = prompt + mask.numel() > ids.numel()
        raise where.error(
            f"the response ({mask.numel()} tokens after prompt_length {prompt}) is "
            f"{'longer' if longer else 'shorter'} than its sequence ({ids.numel()} token_ids); "
            "the response runs to the end of token_ids"
        )
    return _response_row(
        ids=ids, prompt=prompt, rollout=rollout, training=training, mask=mask, source=source
    )


def _neutral_records(file: InputFile) -> Iterator[tuple[int, _NeutralRow, Any, bytes]]:
    """``(line or row, record, its keys on demand, its bytes)`` of a JSONL or Parquet file."""
    if file.path.suffix.lower() in (".parquet", ".pq"):
        yield from _parquet_records(file)
        return
    _not_zip(file, "neutral")
    for number, line in file.lines():
        where = _Where(file.path, line=number)
        row = _line_object(line, _NeutralRow, _NEUTRAL_DECODER, where, "jsonl")
        yield number, row, (lambda line=line: _keys(line)), line


def _parquet_records(file: InputFile) -> Iterator[tuple[int, _NeutralRow, Any, bytes]]:
    """Parquet rows with the neutral format's columns (pyarrow, the ``parquet`` extra),
    read in record batches from the bytes read (and hashed) once."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportInputError(
            file.path,
            "Parquet input needs pyarrow: install the 'parquet' extra "
            "(pip install 'pytest-logprob-drift[parquet]') or write JSONL",
        ) from None
    data = file.read_all()
    try:
        reader = pq.ParquetFile(io.BytesIO(data))
        columns = [c for c in NEUTRAL.fields if c in reader.schema_arrow.names]
        number = 0
        for batch in reader.iter_batches(batch_size=64, columns=columns):
            for record in batch.to_pylist():
                number += 1
                where = _Where(file.path, line=number)
                try:
                    row = msgspec.convert(record, _NeutralRow)
                except msgspec.ValidationError as exc:
                    raise where.error(_validation(exc)) from None
                yield (
                    number,
                    row,
                    (lambda record=record: set(record)),
                    json.dumps(record, sort_keys=True).encode(),
                )
    except ImportInputError:
        raise
    except Exception as exc:
        raise ImportInputError(file.path, f"not a readable Parquet file: {exc}") from None


def read_neutral(paths: Sequence[Path], opened: list[InputFile]) -> Iterator[Step]:
    """Steps of the neutral format, each yielded when the next one starts (a step's samples
    are written together)."""
    return _read_neutral(_open(path, opened) for path in paths)


def read_neutral_span(
    path: Path, span: tuple[int, int, int], opened: list[InputFile]
) -> Iterator[Step]:
    """The steps of the whole lines ``span`` (``(start, stop, first line number)``) of a
    neutral JSONL file that may still grow (``production.follow``: one step's lines)."""
    file = InputFile(path, span=span)
    opened.append(file)
    return _read_neutral([(len(opened) - 1, file)])


def _read_neutral(files: Iterable[tuple[int, InputFile]]) -> Iterator[Step]:
    done: dict[int, str] = {}
    current: Step | None = None
    hasher = hashlib.sha256()
    seen: dict[int, int] = {}
    parts = _InputParts()
    for index, file in files:
        rows = 0
        for number, row, keys, data in _neutral_records(file):
            rows += 1
            where = _Where(file.path, line=number)
            step_id = row.step
            if isinstance(step_id, int) and step_id < 0:
                raise where.error(f"step {step_id} is negative")
            if isinstance(row.sample, int) and row.sample < 0:
                raise where.error(f"sample {row.sample} is negative")
            source = ImportedRow(
                input=index, line=number, sample=row.sample if isinstance(row.sample, int) else None
            )
            parsed = _neutral_row(row, keys, where, source)
            assert isinstance(step_id, int)
            if current is None or current.step != step_id:
                if step_id in done:
                    raise where.error(
                        f"step {step_id} again, after other steps (first at {done[step_id]}): "
                        "write each step's samples together"
                    )
                if current is not None:
                    parts.close(current, hasher)
                    yield current
                current = Step(step=step_id)
                done[step_id] = f"{file.path}:{number}"
                hasher = hashlib.sha256()
                seen = {}
                parts = _InputParts()
            sample = source.sample
            if sample is not None:
                if sample in seen:
                    raise where.error(
                        f"sample {sample} of step {step_id} again (also line {seen[sample]})"
                    )
                seen[sample] = number
            if index not in current.inputs:
                parts.next_input(current, hasher, index)
            hasher.update(data)
            parts.take(data)
            current.rows.append(parsed)
        if not rows:
            raise ImportInputError(file.path, "holds no rows: nothing to import")
    if current is not None:
        parts.close(current, hasher)
        yield current


class _InputParts:
    """A neutral step's own bytes per input file (its inputs are read one after another):
    the step's hasher stands for its first input's until a second input starts, so one
    file's lines are hashed once."""

    def __init__(self) -> None:
        self.digests: dict[int, InputDigest] = {}
        self.part: Any = None
        self.size = 0

    def next_input(self, step: Step, hasher: Any, index: int) -> None:
        if step.inputs:
            self._finish(step, hasher)
        step.inputs.append(index)
        self.part = None if len(step.inputs) == 1 else hashlib.sha256()
        self.size = 0

    def take(self, data: bytes) -> None:
        if self.part is not None:
            self.part.update(data)
        self.size += len(data)

    def _finish(self, step: Step, hasher: Any) -> None:
        sha = (hasher if self.part is None else self.part).hexdigest()
        self.digests[step.inputs[-1]] = InputDigest(sha256=sha, size=self.size)

    def close(self, step: Step, hasher: Any) -> None:
        """The step's ``rows_sha256`` and, per input, the SHA-256 and size of its lines."""
        self._finish(step, hasher)
        step.digest = hasher.hexdigest()
        step.input_digests = dict(self.digests)


READERS = {"nemo-rl": read_nemo_rl, "slime": read_slime, "jsonl": read_neutral}
"""Each format's reader: its input paths (in order) -> steps; every file it opens is appended
to ``opened`` (its SHA-256 and size once read)."""
