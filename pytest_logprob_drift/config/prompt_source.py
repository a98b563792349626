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

Version 2 (``ImportedPromptSource``, written by ``logprob-drift import --worst K
--prompts-out FILE``) records prompts taken as logged from an imported production run rather
than tokenized here: the run (its experiment id, format and input files with their SHA-256),
the ranking, and for every prompt the step, the case, the grid row and the framework's own
sample id and source line or index, with the sample's drift; the tokenizer digests only when
the import was given ``--checkpoint DIR`` (then planning checks them as for version 1).
``parse_source`` reads either version by its ``schema``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_logprob_drift.config.input_file import InputFileError, read_input
from pytest_logprob_drift.config.limits import MAX_JSON_INT
from pytest_logprob_drift.jsontext import json_nesting_fault

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import Any

    from pytest_logprob_drift.records import JsonObject

SOURCE_SCHEMA = "pytest_logprob_drift.prompt_source.v1"
IMPORTED_SOURCE_SCHEMA = "pytest_logprob_drift.prompt_source.v2"
"""The ``source`` of prompts taken from an imported production run (``ImportedPromptSource``)."""
IMPORT_FORMATS = ("nemo-rl", "slime", "jsonl")
WORST_RANKING = (
    "most mismatching active tokens, then largest max |diff|, over the steps judged PASS or "
    "MISMATCH"
)
"""How ``import --worst K`` ranks samples, in the words its ``source`` record carries."""

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

    def to_json(self) -> JsonObject:
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


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportedInputFile:
    """One input file of the imported run, as its ``experiment.json`` records it."""

    path: str
    sha256: str
    size: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportedPrompt:
    """Where one prompt was taken from: the step, its case, the row of the step's token grid,
    the framework's own sample id (None: it logs none), the input file (an index into the
    run's ``inputs``) and the line (JSONL, Parquet row) or index (slime) it was read from, and
    the sample's drift (its mismatching active tokens, of ``active``, and max |diff|)."""

    step: int
    case_id: str
    row: int
    sample: int | None
    input: int
    line: int | None
    index: int | None
    active: int
    mismatches: int
    max_abs_diff: float

    def to_json(self) -> JsonObject:
        return {
            "step": self.step,
            "case_id": self.case_id,
            "row": self.row,
            "sample": self.sample,
            "input": self.input,
            "line": self.line,
            "index": self.index,
            "active": self.active,
            "mismatches": self.mismatches,
            "max_abs_diff": self.max_abs_diff,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportedPromptSource:
    """Prompts taken as logged from an imported production run (``import --worst K``)."""

    experiment_id: str
    format: str
    inputs: tuple[ImportedInputFile, ...]
    prompts: tuple[ImportedPrompt, ...]
    tokenizer_files: Mapping[str, str] | None
    """Tokenizer file name -> SHA-256 of the checkpoint named by ``--checkpoint`` (None: the
    import was given none; planning then has nothing to check)."""
    threshold: float
    """The contract threshold the mismatches were counted at."""
    add_special_tokens: None = None
    """Prompts taken as logged were never tokenized here (version 1 records the choice)."""

    def to_json(self) -> JsonObject:
        return {
            "schema": IMPORTED_SOURCE_SCHEMA,
            "run": {
                "experiment_id": self.experiment_id,
                "format": self.format,
                "inputs": [
                    {"path": f.path, "sha256": f.sha256, "size": f.size} for f in self.inputs
                ],
            },
            "ranking": WORST_RANKING,
            "threshold": self.threshold,
            "tokenizer_files": None
            if self.tokenizer_files is None
            else dict(sorted(self.tokenizer_files.items())),
            "prompts": [p.to_json() for p in self.prompts],
        }


def _count(value: object) -> bool:
    return type(value) is int and value >= 0


def _members(value: Collection[str], path: str, required: set[str], optional: set[str]) -> None:
    unknown = sorted(set(value) - required - optional)
    if unknown:
        raise SourceShapeError(f"{path}.{unknown[0]}", "unknown member")
    missing = sorted(required - set(value))
    if missing:
        raise SourceShapeError(f"{path}.{missing[0]}", "missing")


def _imported_prompt(value: object, path: str, inputs: int) -> ImportedPrompt:
    if not isinstance(value, dict):
        raise SourceShapeError(path, "expected an object")
    names = {"step", "case_id", "row", "sample", "input", "line", "index"}
    _members(value, path, names | {"active", "mismatches", "max_abs_diff"}, set())
    for key in ("step", "row", "input", "active", "mismatches"):
        if not _count(value[key]):
            raise SourceShapeError(f"{path}.{key}", "expected a non-negative integer")
    for key in ("sample", "line", "index"):
        if not (value[key] is None or _count(value[key])):
            raise SourceShapeError(f"{path}.{key}", "expected null or a non-negative integer")
    case_id = value["case_id"]
    if not (
        isinstance(case_id, str)
        and len(case_id) == 16
        and all(c in "0123456789abcdef" for c in case_id)
    ):
        raise SourceShapeError(f"{path}.case_id", "expected a case id (16 hex digits)")
    if value["input"] >= inputs:
        raise SourceShapeError(f"{path}.input", f"names no input (the run has {inputs})")
    if value["mismatches"] > value["active"]:
        raise SourceShapeError(f"{path}.mismatches", "more than the sample's active tokens")
    drift = value["max_abs_diff"]
    if not (type(drift) in (int, float) and drift >= 0 and drift != float("inf")):
        raise SourceShapeError(f"{path}.max_abs_diff", "expected a finite number >= 0")
    return ImportedPrompt(
        step=value["step"],
        case_id=case_id,
        row=value["row"],
        sample=value["sample"],
        input=value["input"],
        line=value["line"],
        index=value["index"],
        active=value["active"],
        mismatches=value["mismatches"],
        max_abs_diff=float(drift),
    )


def parse_imported_source(value: dict[str, Any], prompts: int) -> ImportedPromptSource:
    """The strict reading of a version-2 ``source`` (prompts taken from an imported run)."""
    _members(
        value,
        "source",
        {"schema", "run", "ranking", "threshold", "tokenizer_files", "prompts"},
        set(),
    )
    run = value["run"]
    if not isinstance(run, dict):
        raise SourceShapeError("source.run", "expected an object")
    _members(run, "source.run", {"experiment_id", "format", "inputs"}, set())
    if not isinstance(run["experiment_id"], str) or not run["experiment_id"]:
        raise SourceShapeError("source.run.experiment_id", "expected a non-empty string")
    if run["format"] not in IMPORT_FORMATS:
        raise SourceShapeError("source.run.format", f"expected one of {', '.join(IMPORT_FORMATS)}")
    raw_inputs = run["inputs"]
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise SourceShapeError("source.run.inputs", "expected a non-empty array")
    inputs = []
    for i, item in enumerate(raw_inputs):
        where = f"source.run.inputs[{i}]"
        if not isinstance(item, dict):
            raise SourceShapeError(where, "expected an object")
        _members(item, where, {"path", "sha256", "size"}, set())
        if not isinstance(item["path"], str):
            raise SourceShapeError(f"{where}.path", "expected a string")
        if not _is_hex64(item["sha256"]):
            raise SourceShapeError(f"{where}.sha256", "expected a 64-hex-digit SHA-256")
        if not _count(item["size"]):
            raise SourceShapeError(f"{where}.size", "expected a non-negative integer")
        inputs.append(
            ImportedInputFile(path=item["path"], sha256=item["sha256"], size=item["size"])
        )
    if value["ranking"] != WORST_RANKING:
        raise SourceShapeError("source.ranking", f"expected {WORST_RANKING!r}")
    threshold = value["threshold"]
    if not (type(threshold) in (int, float) and 0 <= threshold < float("inf")):
        raise SourceShapeError("source.threshold", "expected a finite number >= 0")
    files = value["tokenizer_files"]
    if files is not None:
        if not isinstance(files, dict) or not files:
            raise SourceShapeError("source.tokenizer_files", "expected null or a non-empty object")
        for name, digest in files.items():
            if name not in TOKENIZER_FILES or not _is_hex64(digest):
                raise SourceShapeError(
                    f"source.tokenizer_files.{name}",
                    "expected a tokenizer file name and its SHA-256",
                )
    rows = value["prompts"]
    if not isinstance(rows, list):
        raise SourceShapeError("source.prompts", "expected an array")
    if len(rows) != prompts:
        raise SourceShapeError("source.prompts", f"{len(rows)} records for {prompts} prompts")
    return ImportedPromptSource(
        experiment_id=run["experiment_id"],
        format=run["format"],
        inputs=tuple(inputs),
        prompts=tuple(
            _imported_prompt(row, f"source.prompts[{i}]", len(inputs)) for i, row in enumerate(rows)
        ),
        tokenizer_files=None if files is None else dict(files),
        threshold=float(threshold),
    )


def parse_source(value: object, prompts: int) -> PromptSource | ImportedPromptSource:
    """The strict reading of a prompt file's ``source`` (``prompts``: its number of token
    rows), either version; ``SourceShapeError`` names the first wrong member."""
    if not isinstance(value, dict):
        raise SourceShapeError("source", "expected an object")
    if value.get("schema") == IMPORTED_SOURCE_SCHEMA:
        return parse_imported_source(value, prompts)
    if value.get("schema") != SOURCE_SCHEMA:
        raise SourceShapeError(
            "source.schema", f"expected {SOURCE_SCHEMA!r} or {IMPORTED_SOURCE_SCHEMA!r}"
        )
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


def tokenizer_fault(
    source: PromptSource | ImportedPromptSource, checkpoint_dir: Path
) -> str | None:
    """Why the checkpoint directory's tokenizer is not the one ``source`` was tokenized with
    (None when it is, when the directory does not exist yet: execution says so, or when an
    imported run's prompts were written without ``--checkpoint``: nothing to check)."""
    if source.tokenizer_files is None or not checkpoint_dir.is_dir():
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
        again = (
            "import the run again with --checkpoint naming the checkpoint it was trained from"
            if isinstance(source, ImportedPromptSource)
            else "run `logprob-drift prompts` again"
        )
        return (
            f"tokenizer file {name} of checkpoint {checkpoint_dir} {change}: the prompts were "
            f"tokenized with another tokenizer; {again}"
        )
    return None
