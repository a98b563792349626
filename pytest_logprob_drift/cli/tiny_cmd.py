"""The ``tiny`` command: a built-in tiny checkpoint written to a directory of one's own.

Owns wiring the command line to the tiny builds (``runtimes.tiny_model``, imported only when
the command runs): the named build is resolved once into the cache, checked against its
digest, and copied to ``--output``, which must not exist yet (never overwritten), so that
``prompts``, ``init`` and a config's ``identity.checkpoint.uri`` can name it as a local
checkpoint directory. The names come from the torch-free catalog
(``runtimes.TINY_CHECKPOINTS``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from pytest_logprob_drift.errors import ExitCode, UsageError, one_line
from pytest_logprob_drift.runtimes import TINY_CHECKPOINTS, TINY_SCHEME

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import Any, TextIO

NAMES = tuple(c.uri[len(TINY_SCHEME) :] for c in TINY_CHECKPOINTS)
"""The tiny builds by name (``qwen3-h64-v1``, ``llama-h64-v1``, ...)."""
CHAT_TEMPLATES = ("llama-h64-v1", "qwen2-h64-v1", "mistral-h64-v1")
"""The builds that carry a chat template (the tiny Qwen3s have none)."""


def add_tiny_parser(sub: Any) -> None:
    from pytest_logprob_drift.cli import RawDescriptionFormatter

    tiny = sub.add_parser(
        "tiny",
        help="write a built-in tiny checkpoint to a directory",
        description="Build one of the tiny checkpoints this package makes from code (seeded "
        "float32 weights, a BPE tokenizer learned from an in-code corpus; nothing is "
        "downloaded) and write it to a new directory, a Hugging Face checkpoint that "
        "`prompts --checkpoint` and `init --checkpoint` take. Its words are random: the "
        "weights are not trained, so sampled text is gibberish by design. "
        f"{', '.join(CHAT_TEMPLATES)} carry a chat template (for `prompts --messages-field`); "
        "the tiny Qwen3s do not.",
        epilog="exit codes: 0 written, 2 usage error (an unknown name, an output that exists)."
        "\n\nexample:\n  logprob-drift tiny llama-h64-v1 --output runs/tiny-llama",
        formatter_class=RawDescriptionFormatter,
    )
    tiny.add_argument("name", metavar="NAME", choices=NAMES, help="one of " + ", ".join(NAMES))
    tiny.add_argument("--output", required=True, metavar="DIR", help="the new checkpoint directory")


def tiny_command(args: argparse.Namespace, out: TextIO) -> int:
    output = Path(args.output)
    if os.path.lexists(output):
        raise UsageError(f"{one_line(str(output))}: already exists; tiny never overwrites")
    import shutil  # not at import: ``plan`` builds this parser and must not load shutil

    from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint

    resolved = resolve_checkpoint(TINY_SCHEME + args.name, expected_digest=None)
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = output.with_name(f".{output.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(resolved.path, staging, ignore=shutil.ignore_patterns(".build_info.json"))
    staging.rename(output)
    template = "with a chat template" if args.name in CHAT_TEMPLATES else "no chat template"
    print(
        f"wrote {TINY_SCHEME}{args.name} to {one_line(str(output))} "
        f"(digest {resolved.digest[:16]}, {template})",
        file=out,
    )
    return ExitCode.OK
