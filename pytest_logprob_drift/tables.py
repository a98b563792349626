"""Plain-text tables for the terminal (the CLI commands and the pytest summary).

Owns aligning rows of cells under headers with a dashed rule, each cell on one line with its
non-printable characters escaped. Knows nothing about what the cells mean.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_logprob_drift.errors import one_line

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import Any


def render_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Rows under headers; a cell's non-printable characters are escaped (``one_line``): cells
    can quote a config, and a table never drives the terminal or breaks a row."""
    cells = [[one_line(str(h)) for h in headers]] + [
        [one_line(str(c)) for c in row] for row in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
