"""The provenance of a prompt file that ``logprob-drift prompts`` wrote: its ``source`` record.

Owns the record (``PromptSource``: the input file's SHA-256 and format, the field read, the
chat template's SHA-256 when one was applied, the SHA-256 of each tokenizer file of the
checkpoint, ``add_special_tokens``, the caps asked for and the input line of every prompt),
its JSON form and its strict reading (a fault names the JSON path inside the prompt file; the
caps within ``MAX_SOURCE_COUNT``, the bound ``prompts`` parses them with), the tokenizer files
that count (``TOKENIZER_FILES``) and their digests (each file size-checked before it is read;
for ``prompts``, a JSON file's nesting checked too, ``json_nesting_fault``), and the check planning
makes: the tokenizer files of the config's checkpoint directory must be those the prompts were
tokenized with (a changed tokenizer is refused at ``plan``, in one line). A prompt file without
``source`` (token ids written by hand) has nothing to check. Imports no engine; hashlib only
when a record is read or written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_logprob_drift.config.input_file import InputFileError, read_input
from pytest_logprob_drift.config.limits import MAX_JSON_INT
from pytest_logprob_drift.jsontext import json_nesting_fault

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import Any

SOURCE_SCHEMA = "pytest_logprob_drift.prompt_source.v1"

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
"""The files of a checkpoint directory (top level) that make up its tokenizer and chat
template; those present are hashed."""
TOKENIZER_FILE_LIMIT = 512 * 2**20
"""Largest tokenizer file hashed (512 MiB; the largest released ones are tens of MiB)."""
MAX_TOKENIZER_NESTING = 128
"""Deepest nesting of arrays and objects a JSON tokenizer file may have (released ones have
fewer than 10): the tokenizers library's own limit (serde_json's), and far below what makes
Python's JSON reader, which transformers reads them with, run out of recursion."""
MAX_SOURCE_COUNT = MAX_JSON_INT
"""Largest ``limit`` and ``max_prompt_tokens`` a record holds: a prompt file's integers are
read within 2**64 (``config.loader``), and ``prompts`` bounds its options to the same."""


class SourceShapeError(ValueError):
    """A ``source`` record of the wrong shape: ``path`` (JSON path below it) and why."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


@dataclass(frozen=True, slots=True)
class PromptSource:
    """How a prompt file's token ids were made from a user's prompts."""

    input_file: str
    """The input's file name (where it was, not part of what is checked)."""
    input_sha256: str
    input_format: str
    field: str | None
    messages_field: str | None
    chat_template_sha256: str | None
    """SHA-256 of the chat template applied (with the generation prompt); None: none was."""
    add_special_tokens: bool
    tokenizer_files: Mapping[str, str]
    """Tokenizer file name -> SHA-256, for every ``TOKENIZER_FILES`` name the checkpoint had."""
    lines: tuple[int, ...]
    """The input line (or Parquet row) of each prompt, in order."""
    limit: int | None = None
    max_prompt_tokens: int | None = None
    truncated: tuple[int, ...] = ()
    """Input lines whose prompts were cut to ``max_prompt_tokens`` (``--truncate``)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SOURCE_SCHEMA,
            "input": {
                "file": self.input_file,
                "sha256": self.input_sha256,
                "format": self.input_format,
            },
            "field": self.field,
            "messages_field": self.messages_field,
            "chat_template_sha256": self.chat_template_sha256,
            "add_generation_prompt": self.chat_template_sha256 is not None,
            "add_special_tokens": self.add_special_tokens,
            "tokenizer_files": dict(sorted(self.tokenizer_files.items())),
            "limit": self.limit,
            "max_prompt_tokens": self.max_prompt_tokens,
            "truncated": list(self.truncated),
            "lines": list(self.lines),
        }


def sha256_text(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def tokenizer_file_digests(
    checkpoint_dir: Path | str, *, check_nesting: bool = False
) -> dict[str, str]:
    """SHA-256 of each tokenizer file present in ``checkpoint_dir`` (regular files only, each
    at most ``TOKENIZER_FILE_LIMIT`` bytes; ``InputFileError``/``OSError`` otherwise: a size is
    checked before a byte is read). ``check_nesting``: also refuse a ``.json`` file nested
    deeper than ``MAX_TOKENIZER_NESTING`` (``InputFileError`` naming its line and column), as
    ``prompts`` does before transformers reads the files."""
    import hashlib

    directory = Path(checkpoint_dir)
    digests: dict[str, str] = {}
    for name in TOKENIZER_FILES:
        path = directory / name
        try:
            data = read_input(path, TOKENIZER_FILE_LIMIT)
        except FileNotFoundError:
            continue
        except InputFileError as exc:
            raise InputFileError(f"{path}: {exc}") from None
        if check_nesting and name.endswith(".json"):
            fault = json_nesting_fault(data, MAX_TOKENIZER_NESTING)
            if fault is not None:
                raise InputFileError(f"{path}: {fault}")
        digests[name] = hashlib.sha256(data).hexdigest()
    return digests


def _is_hex64(value: object) -> bool:
    return (
        isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    )


def _optional_positive(value: object) -> bool:
    return value is None or (type(value) is int and 0 < value <= MAX_SOURCE_COUNT)


def _lines_of(value: object) -> bool:
    return isinstance(value, list) and all(type(v) is int and v > 0 for v in value)


def parse_source(value: object, prompts: int) -> PromptSource:
    """The strict reading of a prompt file's ``source`` (``prompts``: its number of token
    rows); ``SourceShapeError`` names the first wrong member."""
    if not isinstance(value, dict):
        raise SourceShapeError("source", "expected an object")
    if value.get("schema") != SOURCE_SCHEMA:
        raise SourceShapeError("source.schema", f"expected {SOURCE_SCHEMA!r}")
    known = {
        "schema", "input", "field", "messages_field", "chat_template_sha256",
        "add_generation_prompt", "add_special_tokens", "tokenizer_files", "limit",
        "max_prompt_tokens", "truncated", "lines",
    }  # fmt: skip
    unknown = sorted(set(value) - known)
    if unknown:
        raise SourceShapeError(f"source.{unknown[0]}", "unknown member")
    inp = value.get("input")
    if not isinstance(inp, dict) or set(inp) != {"file", "sha256", "format"}:
        raise SourceShapeError("source.input", "expected {file, sha256, format}")
    if not isinstance(inp["file"], str) or inp["format"] not in ("jsonl", "text", "parquet"):
        raise SourceShapeError("source.input", "expected a file name and a known format")
    if not _is_hex64(inp["sha256"]):
        raise SourceShapeError("source.input.sha256", "expected a 64-hex-digit SHA-256")
    for key in ("field", "messages_field"):
        if not (value.get(key) is None or isinstance(value.get(key), str)):
            raise SourceShapeError(f"source.{key}", "expected null or a string")
    template = value.get("chat_template_sha256")
    if not (template is None or _is_hex64(template)):
        raise SourceShapeError("source.chat_template_sha256", "expected null or a SHA-256")
    if value.get("add_generation_prompt") is not (template is not None):
        raise SourceShapeError(
            "source.add_generation_prompt", "expected true exactly when a chat template was applied"
        )
    if not isinstance(value.get("add_special_tokens"), bool):
        raise SourceShapeError("source.add_special_tokens", "expected a boolean")
    files = value.get("tokenizer_files")
    if not isinstance(files, dict) or not files:
        raise SourceShapeError("source.tokenizer_files", "expected a non-empty object")
    for name, digest in files.items():
        if name not in TOKENIZER_FILES or not _is_hex64(digest):
            raise SourceShapeError(
                f"source.tokenizer_files.{name}", "expected a tokenizer file name and its SHA-256"
            )
    for key in ("limit", "max_prompt_tokens"):
        if not _optional_positive(value.get(key)):
            raise SourceShapeError(
                f"source.{key}", f"expected null or an integer 1 .. {MAX_SOURCE_COUNT}"
            )
    for key in ("truncated", "lines"):
        if not _lines_of(value.get(key)):
            raise SourceShapeError(f"source.{key}", "expected an array of line numbers")
    lines = value["lines"]
    if len(lines) != prompts:
        raise SourceShapeError("source.lines", f"{len(lines)} line numbers for {prompts} prompts")
    return PromptSource(
        input_file=inp["file"],
        input_sha256=inp["sha256"],
        input_format=inp["format"],
        field=value.get("field"),
        messages_field=value.get("messages_field"),
        chat_template_sha256=template,
        add_special_tokens=value["add_special_tokens"],
        tokenizer_files=dict(files),
        lines=tuple(lines),
        limit=value.get("limit"),
        max_prompt_tokens=value.get("max_prompt_tokens"),
        truncated=tuple(value["truncated"]),
    )


def tokenizer_fault(source: PromptSource, checkpoint_dir: Path) -> str | None:
    """Why the checkpoint directory's tokenizer is not the one ``source`` was tokenized with
    (None when it is, or when the directory does not exist yet: execution says so)."""
    if not checkpoint_dir.is_dir():
        return None
    try:
        now = tokenizer_file_digests(checkpoint_dir)
    except (OSError, InputFileError) as exc:
        return f"cannot hash the tokenizer files of {checkpoint_dir} ({exc})"
    for name in sorted(set(source.tokenizer_files) | set(now)):
        was, found = source.tokenizer_files.get(name), now.get(name)
        if was == found:
            continue
        if found is None:
            change = "is missing"
        elif was is None:
            change = "is new"
        else:
            change = f"has changed (SHA-256 {found[:12]}..., tokenized with {was[:12]}...)"
        return (
            f"tokenizer file {name} of checkpoint {checkpoint_dir} {change}: the prompts were "
            "tokenized with another tokenizer; run `logprob-drift prompts` again"
        )
    return None
