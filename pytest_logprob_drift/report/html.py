"""The HTML page of a report: one self-contained file, opened straight from disk.

Owns laying out ``model.ReportData`` as a page, top to bottom: the findings (``findings``; for
an imported run led by the trend over its training steps), the
header (experiment, scenario, contract, run time, runtime, package and engine versions, the
verify status of every attempt), the overview plot, for an imported run the drift over its
training steps (``steps``: the plot, the first crossings, each step's figures and worst samples
linked to their tokens), the case table (outcome coloured, changed
knobs, active tokens, mismatches, max/p99/mean |diff|, the peer metrics other RL frameworks
log, each installed diagnostic's columns, and the attribution columns when a sealed
attribution exists, as ``columns`` declares them: the
default set fits 1280 px, the rest behind a "more columns" toggle; sortable by a few lines of
plain JavaScript), the attribution chart and ranking (marked as rejected, with the reasons,
when ``verify`` rejects it), each installed diagnostic's run-scope section
(``report_run_section`` at its places: the layers' per-layer lines and the routing agreement
of every case before the invalid attempts), the invalid attempts
(listed, never plotted), then one section per detailed case (histogram, |diff| by position,
logprob scatter, the worst tokens with their text in context, the per-sample token view
(``token_html``), each installed diagnostic's sections (``report_section``, then
``report_detail_section`` with its decoded token ids),
requested -> materialized -> actual knob records, identity checks, relative links to the sealed
files), and how the plots aggregate. Nothing is
fetched: no external script, style sheet, font or image; plots are inline SVG from ``plots``.
Every element is built with ``markup.el``, so every text from the run is escaped; the page's
fixed style and script, the plots' SVG and the token data block (``markup.json_script``) are
the only trusted markup. Knows nothing about files, seals, torch or engines.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pytest_logprob_drift.diagnostics.registry import installed
from pytest_logprob_drift.records import JsonValue
from pytest_logprob_drift.report import gates, plots
from pytest_logprob_drift.report.columns import attempt_time, case_anchor, columns
from pytest_logprob_drift.report.findings import SHOWN as FINDINGS_SHOWN
from pytest_logprob_drift.report.findings import Findings, findings
from pytest_logprob_drift.report.markup import (
    Child,
    Markup,
    el,
    fragment_link,
    join,
    page_link,
)
from pytest_logprob_drift.report.model import CaseView, ReportData, WorstToken
from pytest_logprob_drift.report.steps import FIGURES, StepSample, StepsView, format_value
from pytest_logprob_drift.report.summary import fmt_diff
from pytest_logprob_drift.report.token_html import (
    TOKEN_SCRIPT,
    TOKEN_STYLE,
    data_block,
    token_section,
)

RANKING_SHOWN = 30
"""Interventions named in the ranking line (all of them are in the table)."""
PROBLEMS_SHOWN = 10
"""Reasons named when ``verify`` rejects the attribution."""
WORST_HEADERS = ("sample", "position", "id", "token in context", "rollout", "training", "|diff|")
WORST_POSITION_HEADERS = (
    *("sample", "position", "TV", "KL(r||t)", "KL(t||r)"),
    "top tokens (logprobs; share of the position's TV)",
)
RECORD_HEADERS = ("knob", "lifecycle", "requested", "materialized", "actual", "status", "evidence")

STYLE = Markup("""
body{font:13px/1.4 system-ui,sans-serif;margin:1.2em 2em;color:#222;max-width:1500px}
h1{font-size:1.5em;margin:.2em 0}
h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ccc}
h3{font-size:1.05em;margin:.2em 0}
table{border-collapse:collapse;margin:.4em 0}
td,th{padding:2px 7px;border-bottom:1px solid #e2e2e2;text-align:left;vertical-align:top}
th{background:#f3f3f3;position:sticky;top:0}
table.sortable th{cursor:pointer}
table.sortable th:hover{background:#e6e6e6}
td.n{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
#case-table td{white-space:nowrap}
#case-table td.words{white-space:normal;min-width:12em}
#case-table td.label{white-space:normal;overflow-wrap:anywhere;min-width:9em;max-width:22em}
#case-table.show-more td.label{min-width:14em}
#case-table .more{display:none}
#case-table.show-more .more{display:table-cell}
#findings{border:1px solid #d6d6d6;background:#fafafa;padding:.2em .9em .5em;margin:.5em 0}
#findings h2{margin-top:.3em}
#findings ol{margin:.2em 0;padding-left:1.8em}
#findings p{margin:.3em 0}
div.scroll{overflow-x:auto}
dl.meta{display:grid;grid-template-columns:max-content auto;gap:1px 14px;margin:.4em 0}
dl.meta dt{font-weight:600}
dl.meta dd{margin:0}
tr.o-PASS td.outcome{color:#1a6e1a;font-weight:600}
tr.o-MISMATCH{background:#fbe3e3}
tr.o-MISMATCH td.outcome{color:#b00000;font-weight:700}
tr.o-INVALID_IDENTITY,tr.o-INVALID_ARTIFACT,tr.o-NO_VALID_ATTEMPT{background:#fff0d9}
tr.o-STRICT_REJECTED{background:#efe6f6}
tr.o-ZERO_ACTIVE_TOKENS,tr.o-PLAN_ONLY{background:#eeeeee}
tr.changed{font-weight:600}
.badge{display:inline-block;padding:0 6px;border-radius:3px;font-weight:700}
.b-PASS{background:#d7f0d7;color:#1a6e1a}
.b-MISMATCH{background:#f6c6c6;color:#900}
.b-other{background:#ffe2b3;color:#7a4a00}
.plots{display:flex;flex-wrap:wrap;gap:8px}
figure.plot{margin:0;border:1px solid #eee;background:#fff;display:inline-block}
figure.plot svg{display:block;height:auto}
figure.wide svg{max-width:100%}
article.case{border-top:2px solid #ddd;margin-top:1.4em;padding-top:.4em}
article.case table{max-width:100%}
article.case h2,#findings,#attribution p{overflow-wrap:anywhere}
table.identity td:nth-child(2),table.identity td:nth-child(3){overflow-wrap:anywhere}
code.tok{white-space:pre;background:#f4f4f4;padding:0 2px}
mark{background:#ffd84d;padding:0 2px;white-space:pre}
.ctx{font-family:ui-monospace,monospace;font-size:12px}
.muted{color:#666}
.bad{color:#b00000;font-weight:600}
.good{color:#1a6e1a}
details{margin:.3em 0}
summary{cursor:pointer}
table.top{margin:0}
table.top td,table.top th{border-bottom:none;padding:0 5px;font-size:12px}
""")
"""The page's fixed style sheet (trusted markup: it holds no text from a run)."""

SORT_SCRIPT = Markup("""
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var asc = th.dataset.dir !== "asc";
      th.dataset.dir = asc ? "asc" : "desc";
      var key = function (row) {
        var cell = row.cells[col];
        var v = cell.dataset.v !== undefined ? cell.dataset.v : cell.textContent;
        var n = parseFloat(v);
        return isNaN(n) ? [1, v] : [0, n];
      };
      var rows = Array.prototype.slice.call(table.tBodies[0].rows);
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        var c = x[0] - y[0] || (x[1] < y[1] ? -1 : x[1] > y[1] ? 1 : 0);
        return asc ? c : -c;
      });
      rows.forEach(function (r) { table.tBodies[0].appendChild(r); });
    });
  });
});
var moreColumns = document.getElementById("more-columns");
if (moreColumns) {
  moreColumns.addEventListener("click", function () {
    var table = document.getElementById("case-table");
    var shown = table.classList.toggle("show-more");
    moreColumns.setAttribute("aria-pressed", shown ? "true" : "false");
  });
}
""")
"""The page's fixed sort script (trusted markup: it holds no text from a run)."""
_STYLE_ELEMENT = Markup(f"<style>{STYLE}{TOKEN_STYLE}</style>")
_SCRIPT_ELEMENT = Markup(f"<script>{SORT_SCRIPT}{TOKEN_SCRIPT}</script>")

DECODED = Markup("decoded with the checkpoint's tokenizer")
"""Fixed prose, kept as the page has always written it (an apostrophe needs no escaping in
text; the builder escapes quotes in every text from a run)."""


def _td(value: Any, *, num: float | None = None, cls: str = "") -> Markup:
    return el("td", str(value), class_=cls or None, data_v=None if num is None else repr(num))


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _badge(outcome: str) -> Markup:
    kind = outcome if outcome in ("PASS", "MISMATCH") else "other"
    return el("span", outcome, class_=f"badge b-{kind}")


_anchor = case_anchor


def _head(headers: Iterable[Child]) -> Markup:
    return el("thead", el("tr", (el("th", h) for h in headers)))


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], cls: str = "") -> Markup:
    body = el("tbody", (el("tr", (_td(c) for c in row)) for row in rows))
    return el("table", _head(headers), body, class_=cls or None)


# --------------------------------------------------------------------------- header


def _header(data: ReportData) -> Markup:
    h = data.header
    contract = h.contract
    threshold = contract.get("threshold")
    scenario = ", ".join(f"{k} {v}" for k, v in sorted(h.scenario.items()))
    statuses = data.statuses
    ok = sum(1 for s in statuses if s.status == "ok")
    bad = sum(1 for s in statuses if s.status == "invalid")
    incomplete = sum(1 for s in statuses if s.status == "incomplete")
    verify = join(
        [
            el("span", f"{ok} ok", class_="good"),
            ", ",
            el("span", f"{bad} invalid", class_="bad" if bad else "good"),
            f", {incomplete} incomplete (of {len(statuses)} attempts)",
        ]
    )
    meta: list[tuple[str, Child]] = [
        ("scenario", [h.scenario_id, " ", el("span", f"({scenario})", class_="muted")]),
        ("strategy", h.strategy),
        (
            "contract",
            [
                f"source {contract.get('source', '-')}, version "
                f"{contract.get('version', '-')}, threshold ",
                el("b", str(threshold)),
                f" {contract.get('unit', 'nats')}: a token mismatches when "
                "|training - rollout| > threshold",
            ],
        ),
        ("run time", f"{_when(h.first_attempt)} to {_when(h.last_attempt)} (UTC, attempts shown)"),
        ("runtime", ", ".join(h.runtimes) or "-"),
        ("run directory", el("code", h.run_dir)),
        ("verify", verify),
    ]
    return el(
        "header",
        el("h1", f"logprob drift: {h.experiment_id}"),
        _findings(data, findings(data)),
        el("dl", ((el("dt", k), el("dd", v)) for k, v in meta), class_="meta"),
        _versions(h.environments),
        el(
            "details",
            el("summary", "verify status of every attempt"),
            _table(
                ["case", "attempt", "status", "outcome / file", "detail"],
                (
                    [s.case_id, s.attempt_id, s.status, s.outcome or s.file or "", s.detail]
                    for s in statuses
                ),
                "sortable",
            ),
        ),
    )


_when = attempt_time


def _versions(environments: Sequence[Mapping[str, JsonValue]]) -> Markup | None:
    if not environments:
        return None
    keys = sorted({k for e in environments for k in e})
    headers = ["package / environment"] + (
        ["value"] if len(environments) == 1 else [f"set {i + 1}" for i in range(len(environments))]
    )
    rows = [[k, *(str(e.get(k, "-")) for e in environments)] for k in keys]
    return el(
        "details",
        el("summary", "versions and environment (sealed)"),
        _table(headers, rows),
        open=True,
    )


def _findings(data: ReportData, found: Findings) -> Markup:
    """The answer first: the verdict counts, then the interventions the sealed attribution
    says moved a side, ranked, each in words a reader can paste."""
    counts = join(
        (join([_badge(outcome), f" {n}"]) for outcome, n in found.counts),
        " ",
    )
    items = (
        el(
            "li",
            el("b", f.label),
            " ",
            f.predicate(),
            value=f.rank,
            data_label=f.label,
            data_side=f.side.value,
        )
        for f in found.moved[:FINDINGS_SHOWN]
    )
    more = len(found.moved) - FINDINGS_SHOWN
    return el(
        "section",
        el("h2", "Findings"),
        el("p", el("b", found.trend), class_="trend") if found.trend is not None else None,
        _run_sections(data, "findings", draw=False),
        el("p", f"{found.cases} case(s): ", counts, class_="counts"),
        el("p", found.moved_words(), class_="sentence bad" if found.rejected else "sentence"),
        el("ol", items) if found.moved else None,
        el("p", f"... {more} more: sort the table by mean |diff| ratio", class_="muted")
        if more > 0
        else None,
        el("p", within, class_="muted within")
        if (within := found.within_words()) is not None
        else None,
        el("p", found.gates, class_="gates") if found.gates is not None else None,
        id="findings",
    )


# --------------------------------------------------------------------------- training steps


def _step_sample(sample: StepSample) -> Markup:
    text = sample.words()
    if sample.anchor is None:
        return el("span", text, " ", el("span", "(tokens not shown)", class_="muted"))
    return el("a", text, href=fragment_link(sample.anchor), class_="worst-sample")


def _steps(view: StepsView | None, draw: bool) -> Markup | None:
    """Drift over the training steps of an imported run: the plot, the first step each figure
    crossed the contract, and per step its figures and worst samples, each linked to its
    tokens."""
    if view is None:
        return None
    svg = plots.steps_svg(view) if draw else None
    figure = None if svg is None else el("figure", svg, class_="plot wide", data_plot="steps")
    crossings = el(
        "ul",
        (el("li", c.words(), data_figure=c.figure.key) for c in view.crossings),
        class_="crossings",
    )
    headers = ["step", "outcome", "samples", "active", "mismatches"] + [f.name for f in FIGURES]
    body = []
    for row in view.rows:
        step: Child = (
            el("a", str(row.step), href=fragment_link(row.anchor))
            if row.anchor is not None
            else str(row.step)
        )
        worst = (
            el("ul", (el("li", _step_sample(w)) for w in row.worst), class_="worst-samples")
            if row.worst
            else "-"
        )
        body.append(
            el(
                "tr",
                el("td", step, class_="n", data_v=str(row.step)),
                el("td", _badge(row.outcome)),
                _td(_show(row.samples), cls="n"),
                _td(_show(row.active_tokens), cls="n"),
                _td(_show(row.mismatches), cls="n"),
                (
                    _td(format_value(f, row.values.get(f.key)), num=row.values.get(f.key), cls="n")
                    for f in FIGURES
                ),
                class_=f"o-{row.outcome}",
                data_step=str(row.step),
                data_case=row.case_id,
            )
        )
        body.append(
            el(
                "tr",
                el("td", "worst samples:", class_="muted"),
                el("td", worst, colspan=str(len(headers) - 1)),
                class_="worst-row",
            )
        )
    return el(
        "section",
        el("h2", f"Drift over training steps ({len(view.rows)})"),
        el(
            "p",
            "Figures from each step's sealed comparison (verify recomputes them from the "
            "sealed tensors); a step's worst samples rank by their mismatching active tokens, "
            "then their max |diff|. A figure crosses the contract where no step whose every "
            "active token is within the threshold could reach it.",
            class_="muted",
        ),
        figure,
        el("h3", "First step each figure crossed the contract"),
        crossings,
        el("div", el("table", _head(headers), el("tbody", body), class_="steps"), class_="scroll"),
        id="steps",
    )


# --------------------------------------------------------------------------- case table


def _case_table(data: ReportData) -> Markup:
    with_attr = data.attribution is not None
    shown = columns(data)
    more = sum(1 for c in shown if c.more)
    headers = (el("th", c.title, class_="more" if c.more else None) for c in shown)
    rows = [
        el(
            "tr",
            (c.cell(view).element(more=c.more) for c in shown),
            class_=f"o-{view.outcome}",
            data_outcome=view.outcome,
            data_case=view.case_id,
        )
        for view in data.cases
    ]
    detailed = sum(1 for v in data.cases if v.detail is not None)
    rejected = (
        " The attribution columns come from an attribution that verify rejects (see below)."
        if data.attribution_problems and with_attr
        else ""
    )
    toggle = el(
        "button",
        f"more columns ({more})",
        type="button",
        id="more-columns",
        aria_pressed="false",
        aria_controls="case-table",
    )
    return el(
        "section",
        el("h2", f"Cases ({len(data.cases)})"),
        el(
            "p",
            f"Click a column to sort. {detailed} case(s) have a detailed section "
            f"below (linked); the others are summarized by their row.{rejected} ",
            toggle,
            class_="muted",
        ),
        el(
            "div",
            el(
                "table",
                el("thead", el("tr", headers)),
                el("tbody", rows),
                id="case-table",
                class_="sortable",
            ),
            class_="scroll",
        ),
        id="cases",
    )


def _show(value: Any) -> str:
    return "-" if value is None else str(value)


# --------------------------------------------------------------------------- attribution


def _rejected(problems: Sequence[str]) -> Markup | None:
    """What ``verify`` finds wrong with the shown attribution (nothing when it holds)."""
    if not problems:
        return None
    more = len(problems) - PROBLEMS_SHOWN
    return el(
        "div",
        el(
            "p",
            el("b", "Rejected by verify:"),
            " this attribution does not hold (its seal or the attempts it names changed, or "
            "recomputing it from them gives another document); what it says is shown as "
            "sealed, not vouched for.",
            class_="bad",
        ),
        el(
            "ul",
            (el("li", p) for p in problems[:PROBLEMS_SHOWN]),
            el("li", f"... {more} more (run verify)") if more > 0 else None,
        ),
        class_="rejected",
    )


def _attribution(data: ReportData, draw: bool) -> Markup | None:
    document = data.attribution
    if document is None:
        return None
    floor = document.noise_floor
    parts: list[Child] = [
        el("h2", "Attribution: which change moves the drift"),
        _rejected(data.attribution_problems),
        el(
            "p",
            "Each intervention against the baseline (attempt ",
            el("code", document.baseline.attempt_id),
            ") on the tokens both share. ",
            f"Noise floor from {floor.repeats + 1} baseline executions: rollout "
            f"{fmt_diff(floor.rollout_max_abs_delta)}, training "
            f"{fmt_diff(floor.training_max_abs_delta)}."
            if floor.measured
            else "Noise floor not measured (one baseline execution; any movement counts).",
        ),
    ]
    if draw:
        svg = plots.attribution_svg(document)
        if svg is not None:
            rows = len(document.ranking)
            note = (
                el(
                    "figcaption",
                    f"first {plots.ATTRIBUTION_MAX_ROWS} of {rows} "
                    "interventions by rank; every one is in the table",
                    class_="muted",
                )
                if rows > plots.ATTRIBUTION_MAX_ROWS
                else None
            )
            parts.append(el("figure", svg, note, class_="plot wide", data_plot="attribution"))
    ranking = document.ranking
    if ranking:
        more = len(ranking) - RANKING_SHOWN
        parts.append(
            el(
                "p",
                el("b", "Ranked by effect on the drift:"),
                " ",
                join(ranking[:RANKING_SHOWN], " > "),
                f" > \u2026 ({more} more: sort the table by mean |diff| ratio)"
                if more > 0
                else None,
            )
        )
    for skipped in document.skipped:
        parts.append(
            el(
                "p",
                f"not attributed: {skipped.label}: {skipped.reason}",
                class_="muted",
            )
        )
    return el("section", parts, id="attribution")


def _run_sections(data: ReportData, place: str, draw: bool) -> Markup | None:
    """Every installed diagnostic's run-scope part of the page at ``place``, in order
    (``diagnostics.protocol.RUN_PLACES``); None: none has one."""
    parts = [
        part
        for diagnostic in installed()
        if (part := diagnostic.report_run_section(data, place, draw)) is not None
    ]
    return join(parts) if parts else None


def _invalid(data: ReportData) -> Markup | None:
    invalid = data.invalid
    if not invalid:
        return None
    return el(
        "section",
        el("h2", f"Invalid attempts ({len(invalid)})", class_="bad"),
        el(
            "p",
            "These attempts failed verification (tampered, corrupt or inconsistent); nothing "
            "of them is plotted or counted.",
        ),
        _table(
            ["case", "attempt", "file", "detail"],
            ([s.case_id, s.attempt_id, s.file or "-", s.detail] for s in invalid),
        ),
        id="invalid",
    )


# --------------------------------------------------------------------------- per case


def _token(text: str | None, token_id: int) -> str:
    """A token's text as shown: a line break as a visible symbol; every other non-printable
    character is escaped by the builder as the terminal shows it."""
    return (text if text is not None else str(token_id)).replace("\n", "\u23ce")


TINY_WORDS = (
    "; a built-in tiny checkpoint: its weights are seeded, not trained, so its words are "
    "gibberish by design"
)
"""Said beside decoded tokens of a ``tiny://`` checkpoint, whose samples read as noise."""


def _tiny(checks: Sequence[tuple[str, str, str, bool]]) -> bool:
    """Whether the case's identity checks name a built-in ``tiny://`` checkpoint."""
    return any(name == "checkpoint_uri" and '"tiny://' in r for name, r, _, _ in checks)


def _worst(worst: Sequence[WorstToken], decoded: bool, tiny: bool = False) -> Markup:
    rows = []
    for w in worst:
        context = el(
            "span",
            (el("code", _token(t, -1), class_="tok") for t in w.before),
            el("mark", _token(w.text, w.token_id)),
            (el("code", _token(t, -1), class_="tok") for t in w.after),
            class_="ctx",
        )
        rows.append(
            el(
                "tr",
                _td(w.sample, cls="n"),
                _td(w.position, cls="n"),
                _td(w.token_id, cls="n"),
                el("td", context),
                _td(f"{w.rollout:.6f}", cls="n"),
                _td(f"{w.training:.6f}", cls="n"),
                _td(fmt_diff(w.abs_diff), cls="n bad" if w.mismatch else "n"),
            )
        )
    source = join([DECODED, TINY_WORDS if tiny else ""]) if decoded else "token ids (no tokenizer)"
    return join(
        [
            el("h3", "Worst tokens ", el("span", "(", source, ")", class_="muted")),
            el(
                "table",
                _head(WORST_HEADERS),
                el("tbody", rows),
            ),
        ]
    )


def _number(value: Any) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:.4g}"


def _value(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def _records(view: CaseView) -> Markup:
    rows = []
    for r in view.records:
        knob = r.knob
        changed = knob in view.changed
        status = r.status.value
        rows.append(
            el(
                "tr",
                _td(knob + (" (changed)" if changed else "")),
                _td(r.lifecycle.value),
                _td(_value(r.requested)),
                _td(_value(r.materialized)),
                _td(_value(r.actual)),
                _td(status, cls="" if status == "applied" else "bad"),
                _td(r.evidence),
                class_="changed" if changed else None,
            )
        )
    return join(
        [
            el("h3", "Knobs: requested \u2192 materialized \u2192 actual"),
            el(
                "table",
                _head(RECORD_HEADERS),
                el("tbody", rows),
            ),
        ]
    )


def _identity(view: CaseView) -> Markup:
    detail = view.detail
    assert detail is not None
    rows = (
        el(
            "tr",
            _td(name),
            _td(r),
            _td(t),
            _td("same" if same else "DIFFERS", cls="good" if same else "bad"),
        )
        for name, r, t, same in detail.identity_checks
    )
    if view.identity_violations:
        verdict = el("ul", (el("li", v, class_="bad") for v in view.identity_violations))
    else:
        verdict = el(
            "p",
            "No identity violation: checkpoint, tokenizer, token ids, "
            "attention and active masks, positions, packing and the read-only scorer state "
            "all matched.",
            class_="good",
        )
    weights = (
        el(
            "ul",
            (
                el(
                    "li",
                    f"Weights ({side}): {line}",
                    class_="good" if "all equal to the checkpoint" in line else "bad",
                )
                for side, line in view.weights
            ),
        )
        if view.weights
        else None
    )
    evidence = detail.training_evidence
    before, after = evidence.get("state_digest_before"), evidence.get("state_digest_after")
    readonly = (
        el(
            "p",
            "Training scorer state digest before/after scoring: ",
            el(
                "span",
                "unchanged" if before == after else "CHANGED",
                class_="good" if before == after else "bad",
            ),
            " ",
            el("code", str(before)[:16]),
        )
        if before is not None
        else None
    )
    return join(
        [
            el("h3", "Identity checks"),
            verdict,
            weights,
            readonly,
            el(
                "table",
                _head(["field", "rollout", "training", ""]),
                el("tbody", rows),
                class_="identity",
            ),
        ]
    )


def _files(view: CaseView) -> Markup:
    links = join((el("a", name, href=page_link(href)) for name, href in view.files), " \u00b7 ")
    return el(
        "p",
        el("b", "Sealed files"),
        " (attempt ",
        el("code", str(view.attempt_id)),
        "): ",
        links,
    )


def _case_section(view: CaseView, decades: tuple[int, int], draw: bool) -> Markup:
    detail = view.detail
    assert detail is not None
    threshold = float(view.threshold or 0.0)
    figures = None
    if draw:
        drawn = (
            ("histogram", plots.histogram_svg(detail.histogram, threshold, decades)),
            ("position", plots.profile_svg(detail.profile, threshold)),
            ("scatter", plots.scatter_svg(detail.scatter, threshold)),
            *(
                figure
                for diagnostic in installed()
                for figure in diagnostic.report_figures(detail.plots.get(diagnostic.name))
            ),
        )
        figures = el(
            "div",
            (
                el("figure", svg, class_="plot", data_plot=name, data_case=view.case_id)
                for name, svg in drawn
            ),
            class_="plots",
        )
    return el(
        "article",
        el(
            "h2",
            view.label,
            " ",
            _badge(view.outcome),
            " ",
            el("small", view.case_id, class_="muted"),
        ),
        el("p", view.reason),
        figures,
        _worst(detail.worst, detail.decoded, _tiny(detail.identity_checks)),
        token_section(view, decades),
        (diagnostic.report_section(view.diagnostics) for diagnostic in installed()),
        (
            diagnostic.report_detail_section(view.diagnostics, detail.top_token_texts)
            for diagnostic in installed()
        ),
        _records(view),
        _identity(view),
        _files(view),
        class_="case",
        id=_anchor(view),
        data_case=view.case_id,
    )


# --------------------------------------------------------------------------- the page


def _detail_rank(view: CaseView) -> tuple[int, float]:
    """Where a case's detailed section goes: every case whose outcome is not PASS first, then
    by max |diff|, the largest first."""
    max_diff = view.diagnostics.max_abs_diff
    return (0 if view.outcome != "PASS" else 1, -(max_diff if max_diff is not None else -1.0))


def render_page(data: ReportData) -> str:
    """The whole page as one string."""
    draw = plots.available()
    detailed = [v for v in data.cases if v.detail is not None]
    if data.steps is None:  # the cases that answer first; an imported run's steps in order
        detailed.sort(key=_detail_rank)
    decades = plots.histogram_decades(
        [v.detail.histogram for v in detailed if v.detail is not None],
        [float(v.threshold) for v in detailed if v.threshold],
    )
    threshold = _num(data.header.contract.get("threshold"))
    body: list[Child] = [
        _header(data),
        _run_sections(data, "lead", draw),
        _steps(data.steps, draw),
    ]
    if not draw:
        body.append(
            el(
                "p",
                "matplotlib is not installed: no plots (install the ",
                el("code", "report"),
                " extra: ",
                el("code", "pip install -e '.[report]'"),
                ").",
                class_="bad",
            )
        )
    else:
        overview = plots.overview_svg(data.cases, threshold, in_order=data.steps is not None)
        if overview is not None:
            body.append(
                el(
                    "section",
                    el("figure", overview, class_="plot wide", data_plot="overview"),
                    id="overview",
                )
            )
    body += [
        _case_table(data),
        gates.section([(v.label, v.gates) for v in data.cases]),
        _attribution(data, draw),
        _run_sections(data, "body", draw),
        _invalid(data),
    ]
    if detailed:
        body.append(
            el("section", (_case_section(v, decades, draw) for v in detailed), id="details")
        )
    summarized = [v for v in data.cases if v.detail is None and v.attempt_id is not None]
    if summarized:
        body.append(
            el(
                "p",
                f"{len(summarized)} case(s) without a detailed section (limit "
                f"{data.detailed_limit}): see their rows in the table; their sealed files are "
                "linked from the attempt column.",
                class_="muted",
            )
        )
    body.append(
        el(
            "section",
            el("h2", "How the plots aggregate"),
            el("ul", (el("li", n) for n in data.notes)),
            id="notes",
        )
    )
    head = el(
        "head",
        el("meta", charset="utf-8"),
        el("title", f"logprob drift: {data.header.experiment_id}"),
        _STYLE_ELEMENT,
    )
    tokens = data_block(detailed, decades)
    page = el("html", head, el("body", body, tokens, _SCRIPT_ELEMENT), lang="en")
    return f"<!doctype html>{page}\n"
