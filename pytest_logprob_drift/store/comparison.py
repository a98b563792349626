"""Reading an attempt's ``comparison.json`` into its record, or refusing the attempt.

Owns the one entry from a sealed comparison document to ``numerics.comparison.Comparison``:
the strict reader's shape errors become the attempt's ``SealError`` on ``comparison.json``,
naming the JSON path at fault. Used where an attempt is checked (``store.resume``) and by the
readers that open an attempt's comparison themselves (attribution, the report). Knows nothing
about what the numbers mean or how they were computed.
"""

from __future__ import annotations

from typing import Any

from pytest_logprob_drift.numerics.comparison import (
    Comparison,
    ComparisonShapeError,
    read_comparison,
)
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.seal import SealError


def parse_comparison(document: Any) -> Comparison:
    """``document`` (comparison.json, parsed JSON) as its record; a SealError on
    ``comparison.json`` naming the JSON path and what is wrong there otherwise."""
    try:
        return read_comparison(document)
    except ComparisonShapeError as exc:
        raise SealError(layout.COMPARISON, str(exc)) from None
