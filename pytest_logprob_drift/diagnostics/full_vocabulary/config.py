"""The full vocabulary's config key ``$.diagnostics.full_vocabulary`` and execution-key member.

``true`` or ``{"top_k": k, "worst_positions": w}`` (each 1 .. ``DIAGNOSTIC_LIMIT``, default 5):
a ``FullVocabularySpec``; its execution-key member is the spec's canonical form. Torch-free
and typing-free (config loading is on ``plan``'s path).
"""

from __future__ import annotations

from pytest_logprob_drift.diagnostics.config_key import ConfigKey
from pytest_logprob_drift.records import FullVocabularySpec, canonical

TYPE_CHECKING = False  # typing is never imported at run time
if TYPE_CHECKING:
    from pytest_logprob_drift.diagnostics.protocol import ConfigFields
    from pytest_logprob_drift.records import JsonValue

DIAGNOSTIC_LIMIT = 64
"""Most top tokens or worst positions a full-vocabulary diagnostic may ask for."""


def _limited(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 < v <= DIAGNOSTIC_LIMIT


def parse(fields: ConfigFields, value: JsonValue, path: str) -> FullVocabularySpec | None:
    """The spec ``value`` asks for (None: ``false``, or a fault reported)."""
    if isinstance(value, bool):
        return FullVocabularySpec() if value else None
    body = fields.members(value, path, ("top_k", "worst_positions"))
    if body is None:
        return None
    expected = f"a positive integer up to {DIAGNOSTIC_LIMIT}"
    top_k = fields.typed(body, "top_k", path, _limited, expected, 5)
    worst = fields.typed(body, "worst_positions", path, _limited, expected, 5)
    if not isinstance(top_k, int) or not isinstance(worst, int):
        return None
    return FullVocabularySpec(top_k=top_k, worst_positions=worst)


def contribution(spec: object) -> JsonValue:
    """The spec's canonical form (``{"top_k": k, "worst_positions": w}``)."""
    member: JsonValue = canonical(spec)
    return member


CONFIG_KEY = ConfigKey(key="full_vocabulary", parse=parse, contribution=contribution)
