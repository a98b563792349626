"""The read-back of ``actual.json``: nested JSON at birth (v2), string members of v1 parsed once.

Owns ``ReadBackValue`` (a read-back member: a scalar, or a list or object of them),
``read_back_part`` (how a runtime turns a part that has parts into that nested JSON when it
reads back, never into text), ``upgraded`` (a v1 read-back, sealed without ``schema_version``,
whose three JSON-in-a-string members are parsed here, once, at the store's edge) and the typed
parts the tool reads member by member (``WeightsArrived``, ``arrived``). Knows nothing about
any engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, TypeAlias

import msgspec

from pytest_logprob_drift.store.decode import JSONDocumentError, decode_any

ACTUAL_SCHEMA: Final = "cross_config.actual.v2"
"""``actual.json``'s ``schema_version`` since its read-back holds nested parts (absent: v1)."""

ReadBackValue: TypeAlias = (
    "str | int | float | bool | list[ReadBackValue] | dict[str, ReadBackValue] | None"
)
"""One member of a side's read-back or evidence, as sealed in ``actual.json`` v2."""

V1_TEXT_MEMBERS = ("vllm.weights_arrived", "vllm.sampling_applied", "vllm.logp_injection")
"""The read-back members a v1 ``actual.json`` sealed as JSON text (``json.dumps``)."""


def read_back_part(value: object) -> ReadBackValue:
    """``value`` as plain nested JSON (tuples as lists, keys as strings, a non-finite float as
    null; an object JSON has no form for, such as a dtype, as its ``str``): what a runtime
    seals for a read-back part."""
    built: ReadBackValue = msgspec.json.decode(msgspec.json.encode(value, enc_hook=str))
    return built


def upgraded(read_back: Mapping[str, ReadBackValue]) -> dict[str, ReadBackValue]:
    """A v1 read-back with its JSON-text members (``V1_TEXT_MEMBERS``) parsed into the nested
    values a v2 read-back holds; ``ValueError`` naming the member whose text is not JSON."""
    parsed = dict(read_back)
    for name in V1_TEXT_MEMBERS:
        text = parsed.get(name)
        if isinstance(text, str):
            try:
                parsed[name] = decode_any(text)
            except JSONDocumentError as exc:
                raise ValueError(f"not JSON text ({exc}) - at `$.read_back.{name}`") from None
    return parsed


class Open(msgspec.Struct, frozen=True, kw_only=True):
    """A sealed JSON object whose members beyond the declared ones are kept out of the type
    (an engine's evidence, a runtime's self-description: read by nobody field by field)."""


class WeightsArrived(Open, frozen=True, kw_only=True):
    """``vllm.weights_arrived``: how a trainer's push reached the rollout engine (the members
    the report reads; the rest is shown whole)."""

    weight_sync: str
    enable_prefix_caching: bool = False
    prefix_cache_reset: bool = False


def arrived(read_back: Mapping[str, ReadBackValue]) -> WeightsArrived | None:
    """The weights that arrived by a push (None: loaded from the checkpoint, or nothing
    pushed); ``msgspec.ValidationError`` if the sealed part is not that shape."""
    part = read_back.get("vllm.weights_arrived")
    if not isinstance(part, dict) or not part:
        return None
    return msgspec.convert(part, WeightsArrived)
