"""Reading a user's prompts (before they are tokenized): a JSONL file, a plain-text file (one
prompt per line) or a Parquet file (the optional ``parquet`` extra).

Owns what one input prompt is (its 1-based line or row number, and either a text or a list of
chat messages ``[{"role", "content"}]``), which format a file is read as (``.jsonl``/
``.ndjson`` and ``.parquet`` by their suffix, anything else as plain text), and refusing every
bad input in one line naming the file and the line: not UTF-8, not JSON, a missing or
non-string field, an empty prompt, a messages array of the wrong shape, a lone surrogate
(``"\\ud800"`` in JSON: not Unicode, so no tokenizer can encode it), a prompt larger than
``MAX_PROMPT_BYTES`` (what one prompt is tokenized under: the tokenizer's memory grows with a
prompt's length, about 300 bytes per byte of text). A UTF-8 byte-order mark at the start of a
plain-text or JSONL file is dropped (an encoding mark, never part of prompt 1; the input's
SHA-256 is still of the file's bytes as they are). The file is read as ``config.input_file``
reads every input (a regular file within ``PROMPT_INPUT_LIMIT``).
Knows nothing about tokenizers, checkpoints or configs; imports no engine (pyarrow only when
a Parquet file is read).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_logprob_drift.config.input_file import InputFileError, read_input, size_text
from pytest_logprob_drift.errors import UsageError, json_type_name

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    pass

PROMPT_INPUT_LIMIT = 64 * 2**20
"""Largest prompt input file read, in bytes (64 MiB, like a prompt file of token ids)."""
MAX_PROMPT_BYTES = 2**20
"""Largest prompt, in bytes of UTF-8: a text, the messages of a chat, and what a chat template
renders them to (1 MiB: about 250,000 tokens of English; tokenizing it takes about 300 MiB)."""
UTF8_BOM = "\ufeff"
DEFAULT_FIELD = "text"
"""The field a JSONL or Parquet row's text prompt is read from when ``--field`` is not given."""
PARQUET_EXTRA = "parquet"
"""The install extra that provides pyarrow for Parquet input."""

JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")


class PromptInputError(UsageError):
    """A prompt input that cannot be read: ``file``, ``line`` (1-based; 0: the whole file)."""

    def __init__(self, file: Path | str, line: int, message: str) -> None:
        self.file = str(file)
        self.line = line
        where = f"{self.file}:{line}" if line else self.file
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One chat message: who says it and what."""

    role: str
    content: str


@dataclass(frozen=True, slots=True)
class PromptInput:
    """One prompt as the user wrote it: a text, or chat messages (exactly one of them)."""

    line: int
    """1-based line of a JSONL or text file, or row of a Parquet file."""
    text: str | None = None
    messages: tuple[ChatMessage, ...] | None = None


@dataclass(frozen=True, slots=True)
class PromptInputs:
    """The prompts of one input file, with the bytes' SHA-256 and how they were read."""

    file: Path
    sha256: str
    format: str
    """``jsonl``, ``text`` or ``parquet``."""
    field: str | None
    messages_field: str | None
    prompts: tuple[PromptInput, ...]


def input_format(file: Path) -> str:
    suffix = file.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    return "text"


def read_prompt_inputs(
    file: Path | str,
    *,
    field: str | None = None,
    messages_field: str | None = None,
    limit: int | None = None,
) -> PromptInputs:
    """The first ``limit`` (all when None) prompts of ``file``; ``field``: the text field of a
    JSONL/Parquet row (default ``text``), ``messages_field``: the chat-messages field instead.
    Raises ``PromptInputError`` naming the file and line of the first bad prompt."""
    import hashlib

    file = Path(file)
    if field is not None and messages_field is not None:
        raise PromptInputError(file, 0, "give either a text field or a messages field, not both")
    kind = input_format(file)
    if kind == "text" and (field is not None or messages_field is not None):
        raise PromptInputError(
            file,
            0,
            "a plain-text file has one prompt per line and no fields (name a .jsonl or "
            ".parquet file to read a field)",
        )
    if limit is not None and limit < 1:
        raise PromptInputError(file, 0, f"--limit must be a positive integer, got {limit}")
    try:
        data = read_input(file, PROMPT_INPUT_LIMIT)
    except FileNotFoundError:
        raise PromptInputError(file, 0, "no such file") from None
    except OSError as exc:
        raise PromptInputError(file, 0, f"cannot be read ({exc.strerror or exc})") from None
    except (InputFileError, ValueError) as exc:
        raise PromptInputError(file, 0, f"cannot be read: {exc}") from None
    if kind == "text":
        rows: Iterator[PromptInput] = _text_rows(file, data)
        text_field = None
    else:
        text_field = None if messages_field is not None else (field or DEFAULT_FIELD)
        records = _jsonl_records(file, data) if kind == "jsonl" else _parquet_records(file, data)
        rows = (
            _prompt_of(file, line, record, text_field, messages_field) for line, record in records
        )
    prompts: list[PromptInput] = []
    for prompt in rows:
        prompts.append(prompt)
        if limit is not None and len(prompts) == limit:
            break
    if not prompts:
        raise PromptInputError(file, 0, "no prompts in the file")
    return PromptInputs(
        file=file,
        sha256=hashlib.sha256(data).hexdigest(),
        format=kind,
        field=text_field,
        messages_field=messages_field,
        prompts=tuple(prompts),
    )


def _decoded(file: Path, data: bytes) -> str:
    """The text of ``data`` (UTF-8, without a leading byte-order mark)."""
    try:
        return data.decode("utf-8").removeprefix(UTF8_BOM)
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise PromptInputError(
            file, line, f"not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def _lines(file: Path, data: bytes) -> Iterator[tuple[int, str]]:
    text = _decoded(file, data)
    for number, line in enumerate(text.split("\n"), start=1):
        yield number, line.removesuffix("\r")


def _text_rows(file: Path, data: bytes) -> Iterator[PromptInput]:
    lines = list(_lines(file, data))
    if lines and lines[-1][1] == "":
        lines.pop()  # the newline that ends the last line
    for number, line in lines:
        if not line.strip():
            raise PromptInputError(file, number, "empty prompt (a blank line)")
        _check_text(file, number, "the line", line)
        yield PromptInput(line=number, text=line)


def _jsonl_records(file: Path, data: bytes) -> Iterator[tuple[int, object]]:
    for number, line in _lines(file, data):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptInputError(
                file, number, f"not JSON ({exc.msg}, column {exc.colno})"
            ) from None
        except (ValueError, RecursionError) as exc:
            raise PromptInputError(file, number, f"not JSON ({exc.__class__.__name__})") from None


def _parquet_records(file: Path, data: bytes) -> Iterator[tuple[int, object]]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise PromptInputError(
            file,
            0,
            f"reading Parquet needs pyarrow: install the '{PARQUET_EXTRA}' extra "
            f"(pip install 'pytest-logprob-drift[{PARQUET_EXTRA}]')",
        ) from None
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise PromptInputError(file, 0, f"not a Parquet file ({_first_line(exc)})") from None
    yield from enumerate(table.to_pylist(), start=1)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else exc.__class__.__name__


def _prompt_of(
    file: Path, line: int, record: object, field: str | None, messages_field: str | None
) -> PromptInput:
    if not isinstance(record, Mapping):
        raise PromptInputError(file, line, f"expected a JSON object, got {json_type_name(record)}")
    name = messages_field if messages_field is not None else field
    assert name is not None
    if name not in record:
        raise PromptInputError(file, line, f"no field {name!r}")
    value = record[name]
    if messages_field is None:
        if not isinstance(value, str):
            raise PromptInputError(
                file, line, f"field {name!r} is {json_type_name(value)}, expected a string"
            )
        if not value.strip():
            raise PromptInputError(file, line, f"empty prompt (field {name!r})")
        _check_text(file, line, f"field {name!r}", value)
        return PromptInput(line=line, text=value)
    messages = _messages(file, line, name, value)
    size = 0
    for i, message in enumerate(messages):
        for key in ("role", "content"):
            size += _check_text(file, line, f"field {name!r}[{i}].{key}", getattr(message, key))
    if size > MAX_PROMPT_BYTES:
        raise PromptInputError(file, line, _too_large(f"the messages of field {name!r}", size))
    return PromptInput(line=line, messages=messages)


def _check_text(file: Path, line: int, what: str, text: str) -> int:
    """The UTF-8 size of ``text`` (a prompt, or part of one); ``PromptInputError`` for a lone
    surrogate or a text over ``MAX_PROMPT_BYTES``."""
    if len(text) > MAX_PROMPT_BYTES:  # every character is at least one byte
        raise PromptInputError(file, line, _too_large(what, len(text), unit="characters"))
    if text.isascii():
        return len(text)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise PromptInputError(
            file,
            line,
            f"{what} holds a lone surrogate ({_escaped(text[exc.start])} at character "
            f"{exc.start}): not Unicode text",
        ) from None
    if size > MAX_PROMPT_BYTES:
        raise PromptInputError(file, line, _too_large(what, size))
    return size


def _escaped(ch: str) -> str:
    return f"\\u{ord(ch):04x}"


def _too_large(what: str, size: int, unit: str = "bytes of UTF-8") -> str:
    return (
        f"{what} is {size} {unit}, larger than the bound of {size_text(MAX_PROMPT_BYTES)} "
        "for one prompt"
    )


def _messages(file: Path, line: int, name: str, value: object) -> tuple[ChatMessage, ...]:
    shape = 'an array of {"role": string, "content": string} objects'
    if not isinstance(value, (list, tuple)) or not value:
        got = "an empty array" if isinstance(value, (list, tuple)) else json_type_name(value)
        raise PromptInputError(file, line, f"field {name!r} is {got}, expected {shape}")
    messages: list[ChatMessage] = []
    for i, item in enumerate(value):
        where = f"field {name!r}[{i}]"
        if not isinstance(item, Mapping):
            raise PromptInputError(
                file, line, f"{where} is {json_type_name(item)}, expected {shape}"
            )
        extra = sorted(str(k) for k in item if k not in ("role", "content"))
        if extra:
            raise PromptInputError(file, line, f"{where} has unknown key {extra[0]!r}; {shape}")
        for key in ("role", "content"):
            if not isinstance(item.get(key), str):
                got = "missing" if key not in item else json_type_name(item[key])
                raise PromptInputError(file, line, f"{where}.{key} is {got}, expected a string")
        if not item["role"].strip():
            raise PromptInputError(file, line, f"{where}.role is empty")
        messages.append(ChatMessage(role=item["role"], content=item["content"]))
    if not any(m.content.strip() for m in messages):
        raise PromptInputError(file, line, f"empty prompt (every message in {name!r} is empty)")
    return tuple(messages)
