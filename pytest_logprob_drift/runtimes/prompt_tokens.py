"""Freezing a user's prompts into token ids with a checkpoint's own tokenizer.

Owns loading the checkpoint directory's tokenizer (local files only, nothing downloaded; its
tokenizer files and ``config.json`` checked first, before transformers reads them whole: each a
regular file within its size limit, a JSON file nested at most ``MAX_TOKENIZER_NESTING`` deep),
encoding each prompt (a text as it is, or through the checkpoint's own chat template with the
generation prompt: chat messages, or a text as one user message; the template is rendered under
bounds on time, output and memory by ``runtimes.chat_template`` and its text tokenized as
transformers' ``apply_chat_template`` tokenizes it), the prompt-length cap (longer prompts
refused, all of them listed by input line, or cut to the cap only when asked), the size of the
prompt file written (within what planning reads, ``PROMPT_FILE_LIMIT``) and the ``source``
record that says how the ids were made (``config.prompt_source``). Every prompt was bounded
before it gets here (``config.prompt_input.MAX_PROMPT_BYTES``). Every refusal is one line
naming the file and line. Knows nothing about configs, cases, engines or pytest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_logprob_drift.config.input_file import InputFileError, read_input, size_text
from pytest_logprob_drift.config.limits import CONFIG_JSON_LIMIT
from pytest_logprob_drift.config.loader import PROMPT_FILE_LIMIT
from pytest_logprob_drift.config.prompt_input import PromptInput, PromptInputError, PromptInputs
from pytest_logprob_drift.config.prompt_source import (
    MAX_TOKENIZER_NESTING,
    PromptSource,
    sha256_text,
    tokenizer_file_digests,
)
from pytest_logprob_drift.errors import UsageError
from pytest_logprob_drift.jsontext import json_nesting_fault
from pytest_logprob_drift.records import JsonObject
from pytest_logprob_drift.runtimes.chat_template import ChatRenderer

LISTED_LINES = 20
"""At most this many over-long prompts' lines are listed in the refusal (then a count)."""


@dataclass(frozen=True, slots=True)
class FrozenPrompts:
    """Token ids, one row per prompt, and how they were made."""

    token_ids: tuple[tuple[int, ...], ...]
    source: PromptSource

    def to_json(self) -> JsonObject:
        return {"token_ids": [list(row) for row in self.token_ids], "source": self.source.to_json()}


def checked_tokenizer_files(checkpoint_dir: Path) -> dict[str, str]:
    """The SHA-256 of each tokenizer file of ``checkpoint_dir``, each checked as transformers
    could not read it safely (a regular file within its size limit, checked before a byte is
    read; a JSON file nested at most ``MAX_TOKENIZER_NESTING`` deep), and its ``config.json``
    likewise; ``UsageError`` naming the file otherwise."""
    if not checkpoint_dir.is_dir():
        raise UsageError(f"{checkpoint_dir}: not a checkpoint directory")
    config = checkpoint_dir / "config.json"
    try:
        data = read_input(config, CONFIG_JSON_LIMIT)
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        raise UsageError(f"{config}: cannot be read ({_reason(exc)})") from None
    else:
        fault = json_nesting_fault(data, MAX_TOKENIZER_NESTING)
        if fault is not None:
            raise UsageError(f"{config}: {fault}")
    try:
        digests = tokenizer_file_digests(checkpoint_dir, check_nesting=True)
    except InputFileError as exc:
        raise UsageError(f"tokenizer file {exc}") from None
    except OSError as exc:
        raise UsageError(f"{checkpoint_dir}: cannot read its tokenizer files ({exc})") from None
    if not digests:
        raise UsageError(f"{checkpoint_dir}: no tokenizer file to record")
    return digests


def _reason(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def load_tokenizer(checkpoint_dir: Path) -> Any:
    """The checkpoint directory's own tokenizer (``UsageError`` naming the directory if it has
    none that transformers can load from local files). Check its files first
    (``checked_tokenizer_files``)."""
    if not checkpoint_dir.is_dir():
        raise UsageError(f"{checkpoint_dir}: not a checkpoint directory")
    from pytest_logprob_drift.runtimes.transformers.library import quiet_progress_bars, tf

    try:
        with quiet_progress_bars():
            return tf.AutoTokenizer.from_pretrained(str(checkpoint_dir), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, RecursionError, MemoryError) as exc:
        first = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
        raise UsageError(f"{checkpoint_dir}: cannot load its tokenizer ({first})") from None


def _template_file(checkpoint_dir: Path) -> Path:
    jinja = checkpoint_dir / "chat_template.jinja"
    return jinja if jinja.is_file() else checkpoint_dir / "tokenizer_config.json"


def _ids_of(value: Any) -> list[int]:
    """``apply_chat_template(tokenize=True)``'s ids, whether it returns a list or an encoding."""
    if hasattr(value, "keys") and "input_ids" in value:
        value = value["input_ids"]
    return [int(t) for t in value]


def _encode(
    tokenizer: Any,
    renderer: ChatRenderer | None,
    prompt: PromptInput,
    file: Path,
    *,
    add_special_tokens: bool,
) -> list[int]:
    """The ids of ``prompt``: its text as it is, or (``renderer``) what the chat template
    renders, tokenized as ``apply_chat_template`` tokenizes it (no special tokens added)."""
    if renderer is None:
        assert prompt.text is not None
        text = prompt.text
    else:
        messages = (
            [{"role": m.role, "content": m.content} for m in prompt.messages]
            if prompt.messages is not None
            else [{"role": "user", "content": prompt.text or ""}]
        )
        text = renderer.render(messages, f"{file}:{prompt.line}")
        add_special_tokens = False
    return [int(t) for t in tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]]


def _template_variables(tokenizer: Any) -> dict[str, str]:
    """The tokenizer's named special tokens, which ``apply_chat_template`` hands the template."""
    tokens = getattr(tokenizer, "special_tokens_map", {}) or {}
    return {str(k): str(v) for k, v in tokens.items() if isinstance(v, str)}


def _row_bytes(ids: Sequence[int]) -> int:
    """What a row of ids adds to the prompt file ``prompts`` writes (its JSON and separator)."""
    return sum(len(str(t)) for t in ids) + 2 * len(ids) + 6


def freeze_prompts(
    checkpoint_dir: Path,
    inputs: PromptInputs,
    *,
    chat_template: bool,
    add_special_tokens: bool = False,
    max_prompt_tokens: int | None = None,
    truncate: bool = False,
    limit: int | None = None,
) -> FrozenPrompts:
    """Encode ``inputs`` with ``checkpoint_dir``'s tokenizer. Chat messages always go through
    its chat template (``chat_template`` also sends a text through it, as one user message);
    the template is applied with the generation prompt and adds the special tokens it writes
    itself (``add_special_tokens`` applies to plain text only)."""
    if max_prompt_tokens is not None and max_prompt_tokens < 1:
        raise UsageError(f"--max-prompt-tokens must be a positive integer, got {max_prompt_tokens}")
    if truncate and max_prompt_tokens is None:
        raise UsageError("--truncate needs --max-prompt-tokens")
    chat = chat_template or inputs.messages_field is not None
    if chat and add_special_tokens:
        raise UsageError(
            "--add-special-tokens applies to plain text; a chat template writes its own "
            "special tokens"
        )
    digests = checked_tokenizer_files(checkpoint_dir)
    tokenizer = load_tokenizer(checkpoint_dir)
    template_sha = None
    renderer: ChatRenderer | None = None
    if chat:
        template = getattr(tokenizer, "chat_template", None)
        if not isinstance(template, str) or not template:
            asked = (
                "--chat-template" if chat_template else f"--messages-field {inputs.messages_field}"
            )
            raise UsageError(
                f"{_template_file(checkpoint_dir)}: the checkpoint has no chat template "
                f"(asked for by {asked})"
            )
        template_sha = sha256_text(template)
        renderer = ChatRenderer(
            template, _template_variables(tokenizer), _template_file(checkpoint_dir)
        )
    try:
        rows, over, cut = _encode_all(
            tokenizer, renderer, inputs, add_special_tokens, max_prompt_tokens, truncate
        )
    finally:
        if renderer is not None:
            renderer.close()
    if over:
        raise PromptInputError(inputs.file, over[0], _over_cap(over, max_prompt_tokens))
    source = PromptSource(
        input_file=inputs.file.name,
        input_sha256=inputs.sha256,
        input_format=inputs.format,
        field=inputs.field,
        messages_field=inputs.messages_field,
        chat_template_sha256=template_sha,
        add_special_tokens=add_special_tokens,
        tokenizer_files=digests,
        lines=tuple(p.line for p in inputs.prompts),
        limit=limit,
        max_prompt_tokens=max_prompt_tokens,
        truncated=tuple(cut),
    )
    return FrozenPrompts(token_ids=tuple(rows), source=source)


def _encode_all(
    tokenizer: Any,
    renderer: ChatRenderer | None,
    inputs: PromptInputs,
    add_special_tokens: bool,
    max_prompt_tokens: int | None,
    truncate: bool,
) -> tuple[list[tuple[int, ...]], list[int], list[int]]:
    """Each prompt's ids (within the cap), the lines of those over it, the lines cut to it;
    ``UsageError`` once the ids would make a prompt file larger than planning reads."""
    rows: list[tuple[int, ...]] = []
    over: list[int] = []
    cut: list[int] = []
    size = 0
    for prompt in inputs.prompts:
        ids = _encode(
            tokenizer, renderer, prompt, inputs.file, add_special_tokens=add_special_tokens
        )
        if not ids:
            raise PromptInputError(inputs.file, prompt.line, "empty prompt (no tokens)")
        if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
            if not truncate:
                over.append(prompt.line)
                continue
            ids = ids[:max_prompt_tokens]
            cut.append(prompt.line)
        size += _row_bytes(ids)
        if size > PROMPT_FILE_LIMIT:
            raise PromptInputError(
                inputs.file,
                prompt.line,
                f"the token ids up to this prompt make a prompt file larger than the "
                f"{size_text(PROMPT_FILE_LIMIT)} planning reads (pass --limit or "
                "--max-prompt-tokens)",
            )
        rows.append(tuple(ids))
    return rows, over, cut


def _over_cap(lines: Sequence[int], cap: int | None) -> str:
    shown = ", ".join(str(n) for n in lines[:LISTED_LINES])
    more = f" and {len(lines) - LISTED_LINES} more" if len(lines) > LISTED_LINES else ""
    return (
        f"{len(lines)} prompt(s) longer than --max-prompt-tokens {cap}: lines {shown}{more} "
        "(pass --truncate to cut them to the cap)"
    )
