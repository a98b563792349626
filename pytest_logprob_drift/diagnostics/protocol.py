"""What a diagnostic is: the ``Diagnostic`` protocol the hubs call, and nothing else.

A diagnostic owns, under its ``name`` (comparison.json's ``diagnostics.<name>`` and
``report --json``'s ``cases[].diagnostics.<name>``):

- its sealed part's type (``part_type``: a frozen msgspec record; ``registry.diagnostics_type``
  makes ``diagnostics.<name>`` a member of that type after today's declared members when
  ``numerics.comparison.Diagnostics`` does not declare it);
- its engine-side capture (``capture``: what it takes from the case's engines after the paired
  scoring, through a ``CaseUnderCapture`` that ``execute.case`` hands every installed
  diagnostic; the engine calls themselves stay in ``execute/`` or ``runtimes/`` behind the
  capture protocol the folder names, e.g. ``execute.replay`` for the path split; None: it
  captures nothing for this case);
- its pure computation over the scored pair (``seal``: the typed part sealed at execution
  from the verdict's ``(training, rollout, active)`` scores, the tensors token_diffs.pt seals,
  and its own capture);
- its sealed files (``sealed_files``, their tensors from ``files``: the attempt writer seals
  them, the store receives the names and loads them, digest checked, for ``check``);
- its offline check (``check``: the recorded part against what the sealed tensors give
  (token_diffs.pt, score_rollout.pt / score_training.pt and its own files), a ``SealError``
  naming the file at fault; the part computed at read time for an attempt sealed before it
  existed);
- its views: the run table's columns (``table_headers`` / ``table_cells``; an
  ``always_in_table`` diagnostic has its columns among the core ones, others only when a
  case carries the part), the lines of the run output, of the plugin's failure text and of
  the report's verbose text, its junit properties, the ``run --json`` member, the report's
  columns, its section of the report's case article and its figures (``report_plot`` reads
  the plot data from the sealed files when the report loads a shown case, ``report_figures``
  draws it), the page's own columns (``report_page_headers`` / ``report_page_cells``: not in
  the report's text, with their cell class) and a detailed case's section that names tokens
  (``report_token_ids``, decoded by the report for ``report_detail_section``);
- its run-scope part of the report (``report_run_lines`` for the text, ``report_run_section``
  for the page at each of ``RUN_PLACES``): figures and sections over every case, computed at
  read time from the sealed parts the report loaded (the routing agreement of every case, the
  signatures' section and the findings' links to it).

``diagnostics.base`` gives the optional members empty defaults; a diagnostic need not use it.

Its config key ``$.diagnostics.<key>`` and execution-key member (``config_key``: a
``diagnostics.config_key.ConfigKey``, None for a diagnostic asked for by no key): declared
torch-free and typing-free in a built-in folder's ``config`` module, which its ``__init__``
exports as ``CONFIG_KEY`` (config loading is on ``plan``'s path: ``registry.config_keys`` reads
the folders without importing a diagnostic); ``config.loader`` reads ``$.diagnostics`` and
``execute.provenance`` builds the execution key's ``diagnostics`` member by looping over them.

Its contribution to the attribution document (``attribution``: an ``AttributionContribution``,
None for a diagnostic that contributes nothing): its own noise floor from the baseline's
repeats and its members of ``noise_floor`` (the layers' per-state floor), its members of each
comparison of a case against a reference (the layers' ``layers``: first moved layer and where
the drift enters; the path split's ``path``), its members of each case's entry (importance
sampling's ``ess``) and the recomputed document in the form of one sealed before its members
existed. ``attribution.analysis`` loops over the installed diagnostics' contributions and names
none of them.

Torch-free and cheap to import: tensors and markup appear in annotations only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from pytest_logprob_drift.attribution.analysis import Compared, SealedExecution
    from pytest_logprob_drift.attribution.document import Attribution
    from pytest_logprob_drift.diagnostics.config_key import ConfigKey
    from pytest_logprob_drift.execute.protocol import (
        LogpKernel,
        RolloutEngine,
        RolloutOutput,
        RuntimeBinding,
        TrainingOutput,
        TrainingScorer,
    )
    from pytest_logprob_drift.execute.rollout_experts import RolloutExperts
    from pytest_logprob_drift.numerics.comparison import Comparison, Diagnostics, Record
    from pytest_logprob_drift.outcomes import Outcome
    from pytest_logprob_drift.records import JsonObject, JsonValue, ScoringIdentity
    from pytest_logprob_drift.report.markup import Markup
    from pytest_logprob_drift.report.model import ReportData
    from pytest_logprob_drift.store.attempt import Seal

Scores = tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]
"""``(training, rollout, active)`` of a judged case: token_diffs.pt's three tensors."""

Tensors = Mapping[str, "torch.Tensor"]
"""The tensors of one sealed file, by key."""

RUN_PLACES = ("lead", "findings", "body")
"""Where ``report_run_section``'s parts go on the report's page: ``lead`` after its header,
``findings`` inside the findings (after the trend), ``body`` after the attribution and
layers sections (before the invalid cases)."""


Captured = object
"""What one diagnostic's ``capture`` took from a case's engines; only its own ``seal`` and
``files`` read it (None: nothing captured)."""


class CaseUnderCapture(Protocol):
    """What ``execute.case`` hands every installed diagnostic once both sides have scored a
    case and the engines' read-back is known."""

    @property
    def binding(self) -> RuntimeBinding:
        """The case's bound settings (which opt-in diagnostics it asks for)."""
        ...

    @property
    def engine(self) -> RolloutEngine: ...

    @property
    def scorer(self) -> TrainingScorer: ...

    @property
    def identity(self) -> ScoringIdentity: ...

    @property
    def rollout(self) -> RolloutOutput: ...

    @property
    def training(self) -> TrainingOutput: ...

    @property
    def read_back(self) -> Mapping[str, JsonValue]:
        """Both engines' read-back knobs (merged)."""
        ...

    @property
    def batch_size(self) -> int: ...

    @property
    def rollout_logp(self) -> LogpKernel | None:
        """The rollout side's logp kernel (None: the engine's own)."""
        ...

    @property
    def rollout_experts(self) -> RolloutExperts | None:
        """The rollout's expert choices captured while it generated (None: not asked for)."""
        ...

    @property
    def threshold(self) -> float:
        """The installed contract's threshold |diff| (what a token over it is judged by)."""
        ...


class AttributionContribution(Protocol):
    """A diagnostic's members of the attribution document, computed from sealed executions
    (``attribution.analysis`` calls them for every installed diagnostic that has one)."""

    def noise_floor(
        self, baseline: SealedExecution, repeats: Sequence[SealedExecution]
    ) -> object | None:
        """Its own noise floor from the baseline's repeats (None: none), handed back to
        ``floor_members`` and ``comparison_members``; called before the repeats are released."""
        ...

    def floor_members(self, floor: object | None) -> JsonObject:
        """Its members of the document's ``noise_floor`` (empty: none)."""
        ...

    def comparison_members(self, compared: Compared, floor: object | None) -> JsonObject:
        """Its members of a case's comparison against one reference (the baseline or a
        pairwise case's parent; empty: none)."""
        ...

    def case_members(self, case: SealedExecution) -> JsonObject:
        """Its members of an attributed case's entry, beside its effect (empty: none)."""
        ...

    def as_recorded(self, recorded: Attribution, recomputed: Attribution) -> Attribution:
        """``recomputed`` in the form of ``recorded`` where that was sealed before its members
        existed (``verify`` compares the two); ``recomputed`` itself otherwise."""
        ...


class Diagnostic(Protocol):
    """One installed diagnostic; see the module docstring for what each member is for."""

    @property
    def name(self) -> str:
        """Its member of comparison.json's ``diagnostics`` (and its config key's last part)."""
        ...

    @property
    def part_type(self) -> type[Record]:
        """The typed document its part is decoded as (a ``numerics.comparison.Record``)."""
        ...

    @property
    def sealed_files(self) -> tuple[str, ...]:
        """The attempt files it seals beside comparison.json (none: only its part)."""
        ...

    @property
    def always_in_table(self) -> bool:
        """Whether its run-table columns are core columns, shown for every run."""
        ...

    def capture(self, case: CaseUnderCapture) -> Captured | None:
        """What it takes from the case's engines (None: nothing, e.g. not asked for)."""
        ...

    def seal(
        self, outcome: Outcome, scores: Scores | None, captured: Captured | None
    ) -> Mapping[str, Record]:
        """Its typed parts of a case judged ``outcome`` from ``scores`` and its own
        ``captured``, by member of comparison.json's ``diagnostics``: its ``name``, or each
        declared member it owns (the full vocabulary and its semantic offset); none: no
        part."""
        ...

    def files(
        self, outcome: Outcome, scores: Scores | None, captured: Captured | None
    ) -> Mapping[str, Tensors]:
        """The tensors of its sealed files for a case judged ``outcome`` (names among
        ``sealed_files``; none: nothing beside its part)."""
        ...

    def check(
        self,
        comparison: Comparison,
        diffs: Tensors,
        files: Mapping[str, Tensors | None],
        scored: Mapping[str, Tensors],
    ) -> Comparison:
        """``comparison`` once its part agrees with token_diffs.pt's ``diffs``, the sealed
        scores (``scored``: score_rollout.pt and score_training.pt by file name) and its
        sealed ``files`` (None: not sealed), the part filled where it was computed at read
        time; a ``SealError`` naming the file at fault otherwise."""
        ...

    def shown(self, diagnostics: Sequence[Diagnostics | None]) -> bool:
        """Whether its optional run-table columns are shown for these cases."""
        ...

    def table_headers(self) -> tuple[str, ...]:
        """The run table's (and ``import``'s table's) columns."""
        ...

    def table_cells(self, diagnostics: Diagnostics | None) -> list[str]:
        """A case's cells under ``table_headers``."""
        ...

    def run_lines(self, diagnostics: Diagnostics | None) -> list[str]:
        """Lines the run command prints after its table for a case."""
        ...

    def failure_lines(self, diagnostics: Diagnostics | None) -> list[str]:
        """Lines of the plugin's failure text for a case."""
        ...

    def report_lines(self, diagnostics: Diagnostics | None) -> list[str]:
        """Lines of ``report -v``'s text for a case."""
        ...

    def properties(self, diagnostics: Diagnostics | None) -> list[tuple[str, str]]:
        """Junit name/value properties of a case."""
        ...

    def json_parts(self, diagnostics: Diagnostics | None) -> JsonObject:
        """Its members of ``run --json``'s (and ``import --json``'s) result, by key (empty:
        none)."""
        ...

    def report_headers(self) -> tuple[str, ...]:
        """The report's case-table columns (the page's and the text's)."""
        ...

    def report_cells(self, diagnostics: Diagnostics) -> list[tuple[str, float | None]]:
        """``(text, sort value)`` of a case under ``report_headers``."""
        ...

    def report_section(self, diagnostics: Diagnostics) -> Markup | None:
        """Its section of the report's case article (None: none)."""
        ...

    def report_plot(self, directory: Path, seal: Seal, diagnostics: Diagnostics) -> object | None:
        """Its plot data of a shown case, read from the attempt's sealed files (None: none)."""
        ...

    def report_figures(self, plot: object | None) -> tuple[tuple[str, Markup], ...]:
        """Its figures of a shown case (name, svg) from ``report_plot``'s data (none)."""
        ...

    def report_run_lines(self, data: ReportData) -> list[str]:
        """Lines of ``report``'s text over every case, after its case table (none: none)."""
        ...

    def report_run_section(self, data: ReportData, place: str, draw: bool) -> Markup | None:
        """Its run-scope part of the report's page at ``place`` (``RUN_PLACES``; None: none)."""
        ...

    def report_page_headers(self, diagnostics: Sequence[Diagnostics]) -> tuple[str, ...]:
        """The page's case-table columns after ``report_headers`` for these cases, not in the
        report's text (none: no such column on this page)."""
        ...

    def report_page_cells(self, diagnostics: Diagnostics) -> list[tuple[str, float | None, str]]:
        """``(text, sort value, cell class)`` of a case under ``report_page_headers``."""
        ...

    def report_token_ids(self, diagnostics: Diagnostics) -> tuple[int, ...]:
        """The token ids its ``report_detail_section`` names, which the report decodes (none)."""
        ...

    def report_detail_section(
        self, diagnostics: Diagnostics, texts: Mapping[int, str]
    ) -> Markup | None:
        """Its section of a detailed case's article, after every ``report_section``; ``texts``:
        the decoded ``report_token_ids`` of the case (None: none)."""
        ...

    def attribution(self) -> AttributionContribution | None:
        """Its contribution to the attribution document (None: it contributes nothing)."""
        ...

    config_key: ConfigKey | None
    """Its config key ``$.diagnostics.<key>`` and execution-key member (None: none; a built-in
    folder declares it in its ``__init__`` too, read there without importing the diagnostic)."""


class ConfigFields(Protocol):
    """What a ``ConfigKey.parse`` reads a value with: the config loader's checks, which report
    each fault as one message naming its JSON path (all faults of a document together)."""

    def fail(self, path: str, message: str) -> None:
        """Report ``message`` at ``path``."""
        ...

    def expected(self, path: str, what: str, value: object) -> None:
        """Report ``expected <what>, got <type> <value, shortened>`` at ``path``."""
        ...

    def type_name(self, value: object) -> str:
        """The JSON type's name of ``value`` (``boolean``, ``object``, ...), for a message."""
        ...

    def members(
        self, value: object, path: str, allowed: tuple[str, ...]
    ) -> dict[str, JsonValue] | None:
        """``value`` when it is an object with only ``allowed`` keys (each other key reported);
        None (reported) when it is no object."""
        ...

    def typed(
        self,
        obj: Mapping[str, JsonValue],
        key: str,
        path: str,
        check: Callable[[object], bool],
        expected: str,
        default: object,
    ) -> object:
        """``obj[key]`` when ``check`` accepts it, ``default`` when absent, None (reported as
        ``expected ...`` at ``path.key``) otherwise."""
        ...
