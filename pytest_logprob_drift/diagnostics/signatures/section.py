"""The page's signatures: each named cause with its evidence, linked from the findings.

Owns the ``signatures`` section (one item per ``report.signatures.NamedSignature``, anchored
``signature-N``: its sentence, the evidence as a table, and a link to where the numbers are
on the page: the case's detailed section, else the training steps, else the case table) and
the findings' list of links to those items. Knows nothing about files or how signatures are
found.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_logprob_drift.numerics.signature_record import Scope
from pytest_logprob_drift.report.columns import case_anchor
from pytest_logprob_drift.report.markup import Markup, el, fragment_link
from pytest_logprob_drift.report.model import ReportData
from pytest_logprob_drift.report.signatures import NamedSignature


def _source(data: ReportData, signature: NamedSignature) -> tuple[str, str]:
    """``(anchor, words)`` of where the signature's numbers are shown."""
    view = next((v for v in data.cases if v.case_id == signature.case_id), None)
    if view is not None and view.detail is not None:
        return case_anchor(view), f"the numbers of {view.label}"
    if data.steps is not None and (signature.scope is Scope.RUN or signature.step is not None):
        return "steps", "the drift over training steps"
    return "case-table", "the case table"


def findings_links(signatures: Sequence[NamedSignature]) -> Markup | None:
    """The findings' list: each signature's sentence linked to its evidence."""
    if not signatures:
        return None
    return el(
        "ul",
        (
            el(
                "li",
                el("a", el("b", s.id.value), href=fragment_link(s.anchor)),
                f" ({s.where()})",
                data_signature=s.id.value,
            )
            for s in signatures
        ),
        class_="signatures",
    )


def signature_section(data: ReportData, signatures: Sequence[NamedSignature]) -> Markup | None:
    """Every signature with its sentence, its evidence and where its numbers are."""
    if not signatures:
        return None
    items = []
    for s in signatures:
        anchor, words = _source(data, s)
        rows = (
            el(
                "tr",
                el("th", key),
                el("td", ", ".join(map(str, value)) if isinstance(value, tuple) else str(value)),
            )
            for key, value in s.evidence.items()
        )
        items.append(
            el(
                "li",
                el("p", s.words()),
                el("table", el("tbody", rows), class_="evidence"),
                el("p", "see ", el("a", words, href=fragment_link(anchor)), class_="muted"),
                id=s.anchor,
                data_signature=s.id.value,
            )
        )
    return el(
        "section",
        el("h2", "Drift signatures"),
        el(
            "p",
            'What the logged numbers alone point to (docs/PRODUCTION_RUNS.md, "Signatures"); '
            "a signature never changes a verdict.",
            class_="muted",
        ),
        el("ol", items),
        id="signatures",
    )
