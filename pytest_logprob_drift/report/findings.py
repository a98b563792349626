"""The report's findings: the answer first, in words a reader can paste into an issue.

Owns turning a loaded run (``model.ReportData``) into ``Findings``: the verdict counts, then
the interventions whose sealed attribution document says they moved a side (the rollout side,
the training side or both moved beyond the document's noise floor on the tokens they share
with the baseline; the rule ``attribution.analysis.classify`` writes in words), in the
document's ranking order (by effect on the drift), each as one typed ``Finding`` with its side,
where it first moved, where the sampled tokens first diverged and its effect with the bootstrap
interval. Not "the cases that mismatch": with bfloat16 on both sides every case mismatches.

More facts about a finding (its path, the layer it starts in, its importance-sampling cost)
are added as ``FACTS`` entries: a name and a function from the sealed entry to a short text
(or None), shown after the effect by the text, JSON and HTML renderings alike. Reads the
sealed document tolerantly (a value of the wrong type counts as absent: a re-sealed document
is shown, marked as rejected, never trusted to be well formed). Knows nothing about files,
seals or how the findings are drawn.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_logprob_drift.numerics.importance_text import ess_text
from pytest_logprob_drift.numerics.layer_text import where_moved
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.report.model import ReportData


class Side(enum.Enum):
    """Which side of the pair an intervention moved."""

    ROLLOUT = "rollout"
    TRAINING = "training"
    BOTH = "both"

    @property
    def words(self) -> str:
        return "both sides" if self is Side.BOTH else f"the {self.value} side"


@dataclass(frozen=True, slots=True, kw_only=True)
class Fact:
    """One more thing known about a finding: ``name`` (``ESS``) and its text."""

    name: str
    text: str


SHOWN = 10
"""Findings named in the sentence and listed (the rest are counted, and all are in
``report --json`` and the case table)."""

FactSource = Callable[[Mapping[str, Any]], str | None]
"""From a case's sealed attribution entry to the text of one fact (None: not known)."""


def _path_fact(entry: Mapping[str, Any]) -> str | None:
    """The sealed path classification (``attribution.analysis.classify_path``), when the run
    sealed prefill replays (``diagnostics.replay``)."""
    words = _mapping(entry.get("path")).get("classification")
    return words if isinstance(words, str) else None


def _ess_fact(entry: Mapping[str, Any]) -> str | None:
    """The case's normalized ESS as sealed beside its effect (``attribution.importance``)."""
    value = _number(entry.get("ess"))  # attribution.importance.ESS_KEY (that module needs torch)
    return None if value is None else ess_text(value)


def _layer_fact(entry: Mapping[str, Any]) -> str | None:
    """Where in each side's network the sealed attribution by layer says it moved (when the
    run sealed layer captures, ``diagnostics.layers``): ``training side moved from layer 1``."""
    layers = _mapping(entry.get("layers"))
    parts = []
    for side in ("training", "rollout"):
        moved = _mapping(layers.get(side))
        first, error = moved.get("first_moved_layer"), _number(moved.get("max_rel_error"))
        if isinstance(first, str) and error is not None:
            parts.append(
                f"{side} side {where_moved({'first_moved_layer': first, 'max_rel_error': error})}"
            )
    return ", ".join(parts) or None


FACTS: tuple[tuple[str, FactSource], ...] = (
    ("path:", _path_fact),
    ("layers:", _layer_fact),
    ("ESS", _ess_fact),
)
"""``(name, source)`` of the facts a finding carries beyond its side and effect, in the order
they are shown; a diagnostic that lands (path, layer, ESS) adds one entry here."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One intervention whose sealed attribution says it moved a side."""

    rank: int
    """1-based position in the sealed ranking (by effect on the drift)."""
    label: str
    case_id: str
    side: Side
    first_moved: int | None
    """The earliest response position at which a moved side moved."""
    divergence: int | None
    """The earliest response position at which the sampled tokens diverged (None: never)."""
    mean_ratio: float | None
    low: float | None
    high: float | None
    excludes_one: bool
    facts: tuple[Fact, ...] = ()

    def effect_words(self) -> str:
        if self.mean_ratio is None:
            return "effect undefined (the baseline's drift is 0)"
        text = f"mean |diff| x{self.mean_ratio:.3g} the baseline's"
        if self.low is not None and self.high is not None:
            text += f", 95% [{self.low:.3g}, {self.high:.3g}]"
            text += " (excludes 1)" if self.excludes_one else " (includes 1)"
        return text

    def words(self) -> str:
        """The finding in one clause: ``label moved the rollout side from position 0; ...``."""
        return f"{self.label} {self.predicate()}"

    def predicate(self) -> str:
        """What the intervention did: ``moved the rollout side from position 0; ...``."""
        moved = f"moved {self.side.words}"
        if self.first_moved is not None:
            moved += f" from position {self.first_moved}"
        parts = [moved]
        if self.divergence is not None:
            parts.append(f"changed the sampled tokens from position {self.divergence}")
        parts.append(self.effect_words())
        parts.extend(f"{fact.name} {fact.text}" for fact in self.facts)
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "label": self.label,
            "case_id": self.case_id,
            "side": self.side.value,
            "first_moved": self.first_moved,
            "divergence": self.divergence,
            "mean_ratio": {
                "value": self.mean_ratio,
                "low": self.low,
                "high": self.high,
                "excludes_one": self.excludes_one,
            },
            "facts": {fact.name: fact.text for fact in self.facts},
            "words": self.words(),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Findings:
    """What the page and the terminal say first."""

    cases: int
    counts: tuple[tuple[str, int], ...]
    """``(outcome, number of cases)``, the ``Outcome`` order, then any other (no valid
    attempt); only outcomes that occur."""
    attributed: bool
    """Whether a sealed attribution is shown."""
    rejected: bool
    """Whether ``verify`` rejects it (the findings are then as sealed, not vouched for)."""
    interventions: int
    """Interventions the attribution covers."""
    moved: tuple[Finding, ...]
    """In ranking order."""
    unmoved: tuple[str, ...]
    """Attributed interventions that moved neither side, in ranking order."""

    def counts_words(self) -> str:
        counts = ", ".join(f"{n} {outcome}" for outcome, n in self.counts)
        return f"{self.cases} case(s): {counts or 'none'}."

    def moved_words(self) -> str:
        """The sentence naming the interventions that moved a side, in rank order."""
        if not self.attributed:
            return "No sealed attribution: which side moved is not known."
        prefix = (
            "The sealed attribution (REJECTED by verify: as sealed, not vouched for) says "
            if self.rejected
            else "The sealed attribution says "
        )
        if not self.moved:
            return prefix + f"none of the {self.interventions} intervention(s) moved a side."
        names = ", ".join(f"{f.label} ({f.side.value})" for f in self.moved[:SHOWN])
        more = len(self.moved) - SHOWN
        if more > 0:
            names += f" and {more} more"
        return (
            prefix
            + f"{len(self.moved)} of {self.interventions} intervention(s) moved a side, "
            + f"ranked by effect on the drift: {names}."
        )

    def lines(self) -> list[str]:
        """The terminal's findings: counts, the sentence, one line per finding."""
        lines = [self.counts_words(), self.moved_words()]
        lines.extend(f"  {f.rank}. {f.words()}" for f in self.moved[:SHOWN])
        if len(self.moved) > SHOWN:
            lines.append(f"  ... {len(self.moved) - SHOWN} more (report --json lists every one)")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "cases": self.cases,
            "counts": dict(self.counts),
            "attributed": self.attributed,
            "rejected": self.rejected,
            "interventions": self.interventions,
            "moved": [f.to_json() for f in self.moved],
            "unmoved": list(self.unmoved),
            "sentence": self.moved_words(),
        }


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _position(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def moved_side(entry: Mapping[str, Any], floor: Mapping[str, Any]) -> Side | None:
    """The side a sealed entry says moved: a side's max |delta| on the shared tokens above the
    noise floor's (``classify``'s rule); None when neither did."""
    moved = []
    for side in ("rollout", "training"):
        delta = _number(_mapping(entry.get(side)).get("max_abs_delta"))
        level = _number(floor.get(f"{side}_max_abs_delta")) or 0.0
        moved.append(delta is not None and delta > level)
    if all(moved):
        return Side.BOTH
    if moved[0]:
        return Side.ROLLOUT
    if moved[1]:
        return Side.TRAINING
    return None


def _first_moved(entry: Mapping[str, Any], side: Side) -> int | None:
    sides = ("rollout", "training") if side is Side.BOTH else (side.value,)
    offsets = [_position(_mapping(entry.get(s)).get("first_moved_offset")) for s in sides]
    known = [o for o in offsets if o is not None]
    return min(known) if known else None


def _finding(rank: int, entry: Mapping[str, Any], side: Side) -> Finding:
    ratio = _mapping(_mapping(entry.get("effect")).get("mean_ratio"))
    facts = []
    for name, source in FACTS:
        text = source(entry)
        if text is not None:
            facts.append(Fact(name=name, text=text))
    return Finding(
        rank=rank,
        label=str(entry.get("label")),
        case_id=str(entry.get("case_id")),
        side=side,
        first_moved=_first_moved(entry, side),
        divergence=_position(entry.get("earliest_divergence")),
        mean_ratio=_number(ratio.get("value")),
        low=_number(ratio.get("low")),
        high=_number(ratio.get("high")),
        excludes_one=ratio.get("excludes_one") is True,
        facts=tuple(facts),
    )


def _counts(outcomes: Sequence[str]) -> tuple[tuple[str, int], ...]:
    order = [o.value for o in Outcome]
    seen = sorted(set(outcomes), key=lambda o: (order.index(o) if o in order else len(order), o))
    return tuple((o, outcomes.count(o)) for o in seen)


def findings(data: ReportData) -> Findings:
    """The findings of a loaded run."""
    counts = _counts([v.outcome for v in data.cases])
    document = data.attribution
    if document is None:
        return Findings(
            cases=len(data.cases),
            counts=counts,
            attributed=False,
            rejected=False,
            interventions=0,
            moved=(),
            unmoved=(),
        )
    floor = _mapping(document.get("noise_floor"))
    entries = [_mapping(c) for c in document.get("cases") or () if isinstance(c, Mapping)]
    by_label = {str(e.get("label")): e for e in entries}
    ranking = [str(label) for label in document.get("ranking") or ()]
    ordered = [by_label[label] for label in ranking if label in by_label]
    ordered += [e for e in entries if str(e.get("label")) not in ranking]
    moved: list[Finding] = []
    unmoved: list[str] = []
    for rank, entry in enumerate(ordered, start=1):
        side = moved_side(entry, floor)
        if side is None:
            unmoved.append(str(entry.get("label")))
        else:
            moved.append(_finding(rank, entry, side))
    return Findings(
        cases=len(data.cases),
        counts=counts,
        attributed=True,
        rejected=bool(data.attribution_problems),
        interventions=len(ordered),
        moved=tuple(moved),
        unmoved=tuple(unmoved),
    )
