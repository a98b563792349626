"""Token text for reports: the tokenizer of the checkpoint a sealed identity names.

Owns the decoder factory the frontends hand to ``report`` (which may not touch tokenizers):
given a sealed identity's ``checkpoint`` mapping, resolve it to a local directory (``tiny://``
names through ``tiny_model.resolve_checkpoint``, which checks the digest and builds a missing
tiny checkpoint locally; any other URI only when it is an existing directory) and load its
``tokenizer.json`` with the ``tokenizers`` package; each id is decoded on its own, special
tokens included. A checkpoint without a local tokenizer (``synthetic://``, a hub name) gets
None, and the report shows ids. Never downloads anything. Knows nothing about reports, runs or
verdicts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pytest_logprob_drift.records import JsonValue
from pytest_logprob_drift.runtimes import TINY_SCHEME

TOKENIZER_FILE = "tokenizer.json"


def checkpoint_directory(checkpoint: Mapping[str, JsonValue]) -> Path | None:
    """The local directory of the checkpoint (None when it has none)."""
    uri = str(checkpoint.get("uri") or "")
    digest = checkpoint.get("digest")
    if uri.startswith(TINY_SCHEME):  # the builder (torch, transformers) only for a tiny URI
        from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint

        return resolve_checkpoint(uri, expected_digest=str(digest) if digest else None).path
    path = Path(uri)
    return path if uri and path.is_dir() else None


def token_decoder(
    checkpoint: Mapping[str, JsonValue],
) -> Callable[[Sequence[int]], list[str]] | None:
    """Decode each token id to its text with the checkpoint's own tokenizer, or None."""
    directory = checkpoint_directory(checkpoint)
    if directory is None or not (directory / TOKENIZER_FILE).is_file():
        return None
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(directory / TOKENIZER_FILE))

    def decode(ids: Sequence[int]) -> list[str]:
        return [str(tokenizer.decode([int(i)], skip_special_tokens=False)) for i in ids]

    return decode
