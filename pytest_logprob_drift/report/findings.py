"""The report's findings: the answer first, in words a reader can paste into an issue.

Owns turning a loaded run (``model.ReportData``) into ``Findings``: for an imported
production run first the trend over its training steps in one sentence (``report.steps``),
then the drift signatures the logged numbers show (``report.signatures``), then the verdict
counts, then
the interventions whose sealed attribution document says they moved a side (the rollout side,
the training side or both moved beyond the document's noise floor on the tokens they share
with the baseline; the rule ``attribution.analysis.classify`` writes in words), in the
document's ranking order (by effect on the drift), each as one typed ``Finding`` with its side,
where it first moved, where the sampled tokens first diverged and its effect with the bootstrap
interval. Not "the cases that mismatch": with bfloat16 on both sides every case mismatches.
Nor noise: an intervention within the contract (``attribution.materiality``: its case PASSes
with a max |diff| below a tenth of the threshold) is never ranked; it is listed apart, under
``within_contract``, whatever it moved.

More facts about a finding (its path, the layer it starts in, its importance-sampling cost)
are added as ``FACTS`` entries, plus how the rollout got its weights when they were pushed
from the trainer (``weights_fact``, from the case's read-back: a prefix cache not reset
after the push shows as stale cached state) and, for a MoE run that captured routing, the
case's routing beside its reference's (``routing:``: what routing replay or a float32 router
bought): a name and a function from the sealed entry to
a short text (or None), shown after the effect by the text, JSON and HTML renderings alike.
Reads the decoded document's records (``attribution.document``: a document of the wrong form
is never shown). Knows nothing about files, seals or how the findings are drawn.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from msgspec import UNSET

from pytest_logprob_drift.attribution.document import Case, NoiseFloor
from pytest_logprob_drift.attribution.materiality import rule_words
from pytest_logprob_drift.attribution.materiality import within_contract as is_within
from pytest_logprob_drift.numerics.comparison import Diagnostics, RoutingFigures
from pytest_logprob_drift.numerics.importance_text import ess_text
from pytest_logprob_drift.numerics.layer_states import where_moved
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.records import JsonObject
from pytest_logprob_drift.report.gates import finding as gate_finding
from pytest_logprob_drift.report.model import ReportData
from pytest_logprob_drift.report.signatures import NamedSignature, named_signatures
from pytest_logprob_drift.store.read_back import ReadBackValue, arrived


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

FactSource = Callable[[Case], str | None]
"""From a case's sealed attribution entry to the text of one fact (None: not known)."""


def _path_fact(entry: Case) -> str | None:
    """The sealed path classification (``attribution.analysis.classify_path``), when the run
    sealed prefill replays (``diagnostics.replay``)."""
    return None if entry.path is UNSET else entry.path.classification


def _ess_fact(entry: Case) -> str | None:
    """The case's normalized ESS as sealed beside its effect (the document's ``ess``)."""
    return None if entry.ess is UNSET else ess_text(entry.ess)


def _layer_fact(entry: Case) -> str | None:
    """Where in each side's network the sealed attribution by layer says it moved (when the
    run sealed layer captures, ``diagnostics.layers``): ``training side moved from layer 1``."""
    layers = entry.layers
    if layers is UNSET:
        return None
    parts = [
        f"{name} side {where_moved(side.first_moved_layer, side.max_rel_error)}"
        for name, side in (("training", layers.training), ("rollout", layers.rollout))
        if side is not UNSET and side.first_moved_layer is not None
    ]
    return ", ".join(parts) or None


FACTS: tuple[tuple[str, FactSource], ...] = (
    ("path:", _path_fact),
    ("layers:", _layer_fact),
    ("ESS", _ess_fact),
)
"""``(name, source)`` of the facts a finding carries beyond its side and effect, in the order
they are shown; a diagnostic that lands (path, layer, ESS) adds one entry here."""


def weights_fact(read_back: Mapping[str, ReadBackValue]) -> str | None:
    """How the rollout got its weights, from the case's read-back, when it did not load the
    checkpoint from disk (``rollout.weight_sync``): pushed from the trainer, whether the prefix
    cache was reset after the push, and how many prompt tokens of the scored rollout were read
    from prefix-cache blocks (``vllm.prompt_tokens_cached``); blocks read after a push without
    a reset were computed under the previous weights: stale cached state. The read-back is
    ``actual.json``'s as the store decoded it (``store.documents.Actual``: nested parts, a v1
    document's text members already parsed there)."""
    sync = read_back.get("rollout.weight_sync")
    if not isinstance(sync, str) or sync == "checkpoint":
        return None
    pushed = arrived(read_back)
    caching = pushed is not None and pushed.enable_prefix_caching
    reset = pushed is not None and pushed.prefix_cache_reset
    parts = [f"pushed from the trainer ({sync})"]
    if caching:
        parts.append(f"prefix cache {'reset' if reset else 'NOT reset'} after the push")
    cached = read_back.get("vllm.prompt_tokens_cached")
    if isinstance(cached, int) and not isinstance(cached, bool) and cached > 0:
        text = f"{cached} prompt tokens of the scored rollout read from the prefix cache"
        if caching and not reset:
            text += ", blocks computed before the push: stale cached state, not the weights"
        parts.append(text)
    return "; ".join(parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One material intervention whose sealed attribution says it moved a side."""

    rank: int
    """1-based position in the sealed ranking (by effect on the drift) of the material
    interventions."""
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

    def to_json(self) -> JsonObject:
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
    """The material interventions that moved a side, in ranking order."""
    unmoved: tuple[str, ...]
    """Material interventions that moved neither side, in ranking order."""
    trend: str | None = None
    """For an imported run, drift over its training steps in one sentence
    (``report.steps``); the findings lead with it."""
    within_contract: tuple[str, ...] = ()
    """Interventions within the contract (``attribution.materiality``), in ranking order:
    never ranked, whatever they moved."""
    threshold: float | None = None
    """The contract's threshold the materiality rule was applied with."""
    signatures: tuple[NamedSignature, ...] = ()
    """The drift signatures the logged numbers show (``report.signatures``); they lead the
    findings after the trend, and never change a verdict."""
    gates: str | None = None
    """The frameworks' gates the judged cases fail, in one sentence (``report.gates``)."""

    def within_words(self) -> str | None:
        """The line naming the interventions within the contract (None: there are none)."""
        if not self.within_contract:
            return None
        names = ", ".join(self.within_contract[:SHOWN])
        more = len(self.within_contract) - SHOWN
        if more > 0:
            names += f" and {more} more"
        return f"Within the contract ({rule_words(self.threshold)}; not ranked): {names}."

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
            return prefix + (
                f"none of the {self.interventions} intervention(s) moved a side "
                "beyond the contract."
                if self.within_contract
                else f"none of the {self.interventions} intervention(s) moved a side."
            )
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
        lines = [f"signature {s.words()}" for s in self.signatures]
        lines += [self.counts_words(), self.moved_words()]
        if self.trend is not None:
            lines.insert(0, self.trend)
        lines.extend(f"  {f.rank}. {f.words()}" for f in self.moved[:SHOWN])
        if len(self.moved) > SHOWN:
            lines.append(f"  ... {len(self.moved) - SHOWN} more (report --json lists every one)")
        within = self.within_words()
        if within is not None:
            lines.append(within)
        if self.gates is not None:
            lines.append(self.gates)
        return lines

    def to_json(self) -> JsonObject:
        return {
            "cases": self.cases,
            "counts": dict(self.counts),
            "attributed": self.attributed,
            "rejected": self.rejected,
            "interventions": self.interventions,
            "moved": [f.to_json() for f in self.moved],
            "unmoved": list(self.unmoved),
            "within_contract": list(self.within_contract),
            "sentence": self.moved_words(),
            "trend": self.trend,
            "signatures": [s.words() for s in self.signatures],
            "gates": self.gates,
        }


def moved_side(entry: Case, floor: NoiseFloor) -> Side | None:
    """The side a sealed entry says moved: a side's max |delta| on the shared tokens above the
    noise floor's (``classify``'s rule); None when neither did."""
    rollout = entry.rollout.max_abs_delta > floor.rollout_max_abs_delta
    training = entry.training.max_abs_delta > floor.training_max_abs_delta
    if rollout and training:
        return Side.BOTH
    if rollout:
        return Side.ROLLOUT
    if training:
        return Side.TRAINING
    return None


def _first_moved(entry: Case, side: Side) -> int | None:
    sides = (entry.rollout, entry.training) if side is Side.BOTH else (getattr(entry, side.value),)
    known = [s.first_moved_offset for s in sides if s.first_moved_offset is not None]
    return min(known) if known else None


def _finding(
    rank: int,
    entry: Case,
    side: Side,
    read_back: Mapping[str, ReadBackValue] | None = None,
    routing: str | None = None,
) -> Finding:
    ratio = entry.effect.mean_ratio
    facts = []
    for name, source in FACTS:
        text = source(entry)
        if text is not None:
            facts.append(Fact(name=name, text=text))
    weights = None if read_back is None else weights_fact(read_back)
    if weights is not None:
        facts.append(Fact(name="weights:", text=weights))
    if routing is not None:
        facts.append(Fact(name="routing:", text=routing))
    return Finding(
        rank=rank,
        label=entry.label,
        case_id=entry.case_id,
        side=side,
        first_moved=_first_moved(entry, side),
        divergence=entry.earliest_divergence,
        mean_ratio=ratio.value,
        low=ratio.low,
        high=ratio.high,
        excludes_one=ratio.excludes_one,
        facts=tuple(facts),
    )


def _counts(outcomes: Sequence[str]) -> tuple[tuple[str, int], ...]:
    order = [o.value for o in Outcome]
    seen = sorted(set(outcomes), key=lambda o: (order.index(o) if o in order else len(order), o))
    return tuple((o, outcomes.count(o)) for o in seen)


def _routing(data: ReportData, entry: Case) -> str | None:
    """The case's routing beside its reference case's, when both captured it."""
    views = {c.label: c for c in data.cases}
    case, reference = views.get(entry.label), views.get(entry.reference.label)
    if case is None or reference is None:
        return None
    return _against_reference(case.diagnostics, reference.diagnostics)


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _against_reference(case: Diagnostics, reference: Diagnostics) -> str | None:
    """The case's routing beside its reference's, for a finding (what replay or a float32
    router bought): ``same experts by layer 100.0%, 100.0% (baseline 99.0%, 99.0%); 0.0% with
    a flip (baseline 1.0%)``; None unless both have routing figures."""
    ours, theirs = case.routing, reference.routing
    if ours is None or theirs is None or ours.figures is None or theirs.figures is None:
        return None

    def by_layer(figures: RoutingFigures) -> str:
        return ", ".join(_share(a) for a in figures.agreement_by_layer)

    return (
        f"same experts by layer {by_layer(ours.figures)} (baseline {by_layer(theirs.figures)}); "
        f"{_share(ours.figures.flip_share)} with a flip (baseline "
        f"{_share(theirs.figures.flip_share)})"
    )


def _read_back(data: ReportData, label: str) -> Mapping[str, ReadBackValue] | None:
    """The case's read-back when the report loaded its detail (None otherwise)."""
    view = next((c for c in data.cases if c.label == label), None)
    return None if view is None or view.detail is None else view.detail.read_back


def threshold(data: ReportData) -> float | None:
    """The contract's threshold of the run: its cases' (the first that has one), else the
    header's contract."""
    known = next((v.threshold for v in data.cases if v.threshold is not None), None)
    if known is None:
        sealed = data.header.contract.get("threshold")
        known = sealed if isinstance(sealed, (int, float)) else None
    return None if known is None else float(known)


def within_contract(data: ReportData) -> frozenset[str]:
    """Labels, as the sealed attribution names them, of the interventions within the contract
    (``attribution.materiality``), matched to the shown cases by case id."""
    document = data.attribution
    if document is None:
        return frozenset()
    contract = threshold(data)
    ids = {
        view.case_id
        for view in data.cases
        if is_within(
            view.outcome,
            view.diagnostics.statistic("max_abs_diff"),
            contract if view.threshold is None else float(view.threshold),
        )
    }
    return frozenset(entry.label for entry in document.cases if entry.case_id in ids)


def findings(data: ReportData) -> Findings:
    """The findings of a loaded run."""
    counts = _counts([v.outcome for v in data.cases])
    document = data.attribution
    trend = None if data.steps is None else data.steps.trend()
    signatures = named_signatures(data)
    if document is None:
        return Findings(
            cases=len(data.cases),
            counts=counts,
            attributed=False,
            rejected=False,
            interventions=0,
            moved=(),
            unmoved=(),
            trend=trend,
            signatures=signatures,
            gates=gate_finding([(v.label, v.gates) for v in data.cases]),
        )
    ordered = document.ranked()
    ordered += [e for e in document.cases if e.label not in document.ranking]
    within = within_contract(data)
    moved: list[Finding] = []
    unmoved: list[str] = []
    apart = [e.label for e in ordered if e.label in within]
    material = [e for e in ordered if e.label not in within]
    for rank, entry in enumerate(material, start=1):
        side = moved_side(entry, document.noise_floor)
        if side is None:
            unmoved.append(entry.label)
        else:
            moved.append(
                _finding(rank, entry, side, _read_back(data, entry.label), _routing(data, entry))
            )
    return Findings(
        cases=len(data.cases),
        counts=counts,
        attributed=True,
        rejected=bool(data.attribution_problems),
        interventions=len(ordered),
        moved=tuple(moved),
        gates=gate_finding([(v.label, v.gates) for v in data.cases]),
        unmoved=tuple(unmoved),
        trend=trend,
        within_contract=tuple(apart),
        threshold=threshold(data),
        signatures=signatures,
    )
