"""Numeric command-line options bounded where they are parsed.

Owns ``int_option``: an argparse ``type`` that accepts a decimal integer within the range the
tool's own readers accept for what the option becomes (a prompt file's ``source``, a config's
sampling), so nothing a command writes is refused by another (``prompts --limit 10**30`` would
write an integer ``init`` and ``plan`` cannot read). A refusal is argparse's one line, exit 2,
with the value shown escaped and cut short. Imports only argparse and ``errors``.
"""

from __future__ import annotations

import argparse

from pytest_logprob_drift.errors import one_line

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from collections.abc import Callable

SHOWN_CHARACTERS = 40
"""At most this many characters of a refused value are shown."""


def int_option(low: int, high: int, *, high_text: str | None = None) -> Callable[[str], int]:
    """An argparse ``type``: a decimal integer ``low .. high`` (``high_text``: how the message
    writes ``high``, such as ``2**64 - 1``)."""
    shown_high = high_text or str(high)
    digits = len(str(high)) + 1  # a sign, and no longer a literal than the bound's

    def parse(text: str) -> int:
        value: int | None = None
        stripped = text.strip()
        if len(stripped) <= digits and stripped.lstrip("+-").isascii():
            try:
                value = int(stripped, 10)
            except ValueError:
                value = None
        if value is None or not low <= value <= high:
            shown = one_line(text[:SHOWN_CHARACTERS]) + (
                "..." if len(text) > SHOWN_CHARACTERS else ""
            )
            raise argparse.ArgumentTypeError(
                f"expected an integer {low} .. {shown_high}, got '{shown}'"
            )
        return value

    parse.__name__ = "integer"  # argparse names the type in its messages
    return parse
