"""Decoding an attempt's ``comparison.json`` into its record, or refusing the attempt.

Owns the one entry from sealed comparison bytes to ``numerics.comparison.Comparison``:
``store.decode`` decodes them once into the record, and a type, shape or syntax error becomes
the attempt's ``SealError`` on ``comparison.json``, naming the JSON path at fault (or the byte
offset of a syntax error). Used where an attempt is checked (``store.resume``) and by the
readers that open an attempt's comparison themselves (attribution, the report). Knows nothing
about what the numbers mean or how they were computed.
"""

from __future__ import annotations

from pytest_logprob_drift.numerics.comparison import Comparison
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.decode import JSONDocumentError, decode
from pytest_logprob_drift.store.seal import SealError


def parse_comparison(data: bytes) -> Comparison:
    """``data`` (comparison.json's sealed bytes) as its record; a SealError on
    ``comparison.json`` naming the JSON path and what is wrong there otherwise."""
    try:
        return decode(data, Comparison)
    except JSONDocumentError as exc:
        raise SealError(layout.COMPARISON, str(exc)) from None
