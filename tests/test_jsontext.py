"""``jsontext``: its scans agree with a reading of the parsed value, on any JSON text.

``strings_cut`` is checked against the plain pattern it shortcuts (every string literal taken
out), and ``nested_deeper_than`` / ``json_nesting_fault`` against the depth of the value that
``json.loads`` builds, computed here by recursion.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pytest_logprob_drift.jsontext import json_nesting_fault, nested_deeper_than, strings_cut

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')

_TEXT = st.text(alphabet=st.sampled_from('ab"\\[]{}:,\n\u00e9\u2028 0'), max_size=8)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=20,
)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


@given(value=_VALUES, ascii_only=st.booleans())
def test_strings_cut_and_depth_agree_with_the_parsed_value(value: Any, ascii_only: bool) -> None:
    data = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8")
    cut = strings_cut(data)
    assert cut == _STRING.sub(b"", data)
    assert b'"' not in cut
    depth = _depth(value)
    for limit in range(depth + 1):
        assert nested_deeper_than(cut, limit) is (depth > limit)
        assert (json_nesting_fault(data, limit) is not None) is (depth > limit)


def test_a_quote_inside_a_string_takes_the_escaped_path() -> None:
    data = b'{"a\\"[[[": [1, "]]"], "b": {"c": "{"}}'
    assert strings_cut(data) == b"{: [1, ], : {: }}"
    assert nested_deeper_than(strings_cut(data), 1)
    assert not nested_deeper_than(strings_cut(data), 2)
    assert json_nesting_fault(data, 1) == "nested deeper than 1 levels (line 1, column 12)"


def test_brackets_left_open_count_as_nested() -> None:
    assert nested_deeper_than(strings_cut(b'[[["x"'), 2)
    assert not nested_deeper_than(strings_cut(b'[["x"'), 2)
