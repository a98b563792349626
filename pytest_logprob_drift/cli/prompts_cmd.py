"""The ``prompts`` command: a user's prompts frozen into the prompt file a config names.

Owns wiring the command line to reading the input (``config.prompt_input``), tokenizing with
the checkpoint's own tokenizer (``runtimes.prompt_tokens``, imported only here, when the
command runs) and writing the prompt file ``identity.prompts.file`` accepts: one token-id row
per line and the ``source`` record (``config.prompt_source``), written to a temporary file
and renamed into place. ``--limit`` and ``--max-prompt-tokens`` are bounded where they are
parsed by what the ``source`` record may hold (``cli.options``). Prints where it wrote (the
path escaped, as every message shows input text) and how many prompts.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from pytest_logprob_drift.cli.options import int_option
from pytest_logprob_drift.config.prompt_source import MAX_SOURCE_COUNT
from pytest_logprob_drift.errors import ExitCode, UsageError, one_line

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import Any, TextIO


def add_prompts_parser(sub: Any) -> None:
    from pytest_logprob_drift.cli import RawDescriptionFormatter

    prompts = sub.add_parser(
        "prompts",
        help="tokenize text or chat prompts into a prompt file of token ids",
        description="Freeze prompts into the token ids a config's identity.prompts.file takes, "
        "with the checkpoint's own tokenizer (nothing is downloaded), and record where they "
        "came from (the input's and every tokenizer file's SHA-256) so that `plan` refuses a "
        "tokenizer changed since. Each bad input is one line naming the file and line, exit 2.",
        epilog="example:\n  logprob-drift prompts --checkpoint ./my-model prompts.jsonl "
        "--messages-field messages \\\n      --output prompts.json",
        formatter_class=RawDescriptionFormatter,
    )
    prompts.add_argument("input", help="JSONL, plain text (one prompt per line) or Parquet")
    prompts.add_argument(
        "--checkpoint",
        required=True,
        metavar="DIR",
        help="the checkpoint directory whose own tokenizer (and chat template) is used",
    )
    prompts.add_argument(
        "--output", required=True, metavar="FILE", help="the prompt file, never overwritten"
    )
    fields = prompts.add_mutually_exclusive_group()
    fields.add_argument("--field", default=None, help="the text field of a row (default: text)")
    fields.add_argument(
        "--messages-field",
        default=None,
        metavar="FIELD",
        help='the field holding chat messages [{"role": ..., "content": ...}] (applies the '
        "checkpoint's chat template)",
    )
    prompts.add_argument(
        "--chat-template",
        action="store_true",
        help="apply the checkpoint's own chat template with the generation prompt",
    )
    prompts.add_argument(
        "--add-special-tokens",
        action="store_true",
        help="let the tokenizer add its special tokens to a plain text prompt",
    )
    count = int_option(1, MAX_SOURCE_COUNT, high_text="2**64 - 1")  # what the source holds
    prompts.add_argument(
        "--limit", type=count, default=None, metavar="N", help="keep the first N prompts"
    )
    prompts.add_argument(
        "--max-prompt-tokens",
        type=count,
        default=None,
        metavar="N",
        help="refuse prompts longer than N tokens, listing their lines (see --truncate)",
    )
    prompts.add_argument(
        "--truncate",
        action="store_true",
        help="cut prompts longer than --max-prompt-tokens to their first N tokens "
        "(default: refuse them)",
    )


def prompts_command(args: argparse.Namespace, out: TextIO) -> int:
    from pytest_logprob_drift.config.prompt_input import read_prompt_inputs

    if os.path.lexists(args.output):  # before any work; _write refuses a race too
        raise UsageError(f"{args.output}: already exists; prompts never overwrites a file")

    inputs = read_prompt_inputs(
        args.input, field=args.field, messages_field=args.messages_field, limit=args.limit
    )
    from pytest_logprob_drift.runtimes.prompt_tokens import freeze_prompts

    frozen = freeze_prompts(
        Path(args.checkpoint),
        inputs,
        chat_template=args.chat_template,
        add_special_tokens=args.add_special_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
        truncate=args.truncate,
        limit=args.limit,
    )
    output = Path(args.output)
    _write(output, frozen.to_json())
    cut = len(frozen.source.truncated)
    note = f", {cut} truncated to {args.max_prompt_tokens} tokens" if cut else ""
    print(f"wrote {len(frozen.token_ids)} prompt(s) to {one_line(str(output))}{note}", file=out)
    return ExitCode.OK


def _write(output: Path, document: dict[str, Any]) -> None:
    rows = ",\n    ".join(json.dumps(row) for row in document["token_ids"])
    source = json.dumps(document["source"], indent=2, sort_keys=True).replace("\n", "\n  ")
    text = f'{{\n  "token_ids": [\n    {rows}\n  ],\n  "source": {source}\n}}\n'
    import tempfile  # not at import: it loads shutil, which ``plan`` never needs

    parent = output.parent if str(output.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{output}: its directory does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", dir=parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.link(tmp, output)  # publishes the whole file, and only where nothing is
    except FileExistsError:
        raise UsageError(f"{output}: already exists; prompts never overwrites a file") from None
    finally:
        Path(tmp).unlink(missing_ok=True)
