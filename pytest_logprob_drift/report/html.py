"""The HTML page of a report: one self-contained file, opened straight from disk.

Owns laying out ``model.ReportData`` as a page, top to bottom: the header (experiment,
scenario, contract, run time, runtime, package and engine versions, the verify status of every
attempt), the overview plot, the case table (outcome coloured, changed knobs, active tokens,
mismatches, max/p99/mean |diff|, the peer metrics other RL frameworks log, KL both ways, TV
and the semantic offset when some case has full-vocabulary diagnostics, and the attribution
columns when a sealed attribution exists; sortable by a few lines of plain
JavaScript), the attribution chart and ranking, the invalid attempts (listed, never plotted),
then one section per detailed case (histogram, |diff| by position, logprob scatter, the worst
tokens with their text in context, the full-vocabulary divergence and the semantic offset when
the case has them, requested -> materialized -> actual knob records, identity checks, relative
links to the sealed files), and how the plots aggregate. Nothing is fetched:
no external script, style sheet, font or image; plots are inline SVG from ``plots``. Knows
nothing about files, seals, torch or engines.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pytest_logprob_drift.numerics.text import entries
from pytest_logprob_drift.report import plots
from pytest_logprob_drift.report.model import CaseView, ReportData, WorstToken
from pytest_logprob_drift.report.summary import (
    FULL_VOCAB_COLUMNS,
    PEER_METRICS,
    STATISTICS,
    fmt_diff,
    fmt_ratio,
    full_vocabulary_cells,
    has_full_vocabulary,
    interval,
    reduction_rows,
)
from pytest_logprob_drift.store import layout

_esc = html.escape
RANKING_SHOWN = 30
"""Interventions named in the ranking line (all of them are in the table)."""

STYLE = """
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
#case-table td.words{white-space:normal;min-width:13em}
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
.badge{display:inline-block;padding:0 6px;border-radius:3px;font-weight:700}
.b-PASS{background:#d7f0d7;color:#1a6e1a}
.b-MISMATCH{background:#f6c6c6;color:#900}
.b-other{background:#ffe2b3;color:#7a4a00}
.plots{display:flex;flex-wrap:wrap;gap:8px}
figure.plot{margin:0;border:1px solid #eee;background:#fff;display:inline-block}
figure.plot svg{display:block;height:auto}
figure.wide svg{max-width:100%}
article.case{border-top:2px solid #ddd;margin-top:1.4em;padding-top:.4em}
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
"""

SORT_SCRIPT = """
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
"""


def _td(value: Any, *, num: float | None = None, cls: str = "") -> str:
    attrs = f" class='{cls}'" if cls else ""
    if num is not None:
        attrs += f" data-v='{num!r}'"
    return f"<td{attrs}>{_esc(str(value))}</td>"


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _badge(outcome: str) -> str:
    kind = outcome if outcome in ("PASS", "MISMATCH") else "other"
    return f"<span class='badge b-{kind}'>{_esc(outcome)}</span>"


def _anchor(view: CaseView) -> str:
    return f"case-{view.case_id}"


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], cls: str = "") -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in rows)
    attr = f" class='{cls}'" if cls else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# --------------------------------------------------------------------------- header


def _header(data: ReportData) -> str:
    h = data.header
    contract = h.contract
    threshold = contract.get("threshold")
    scenario = ", ".join(f"{k} {v}" for k, v in sorted(h.scenario.items()))
    statuses = data.statuses
    ok = sum(1 for s in statuses if s.status == "ok")
    bad = sum(1 for s in statuses if s.status == "invalid")
    incomplete = sum(1 for s in statuses if s.status == "incomplete")
    verify = (
        f"<span class='good'>{ok} ok</span>, "
        f"<span class='{'bad' if bad else 'good'}'>{bad} invalid</span>, "
        f"{incomplete} incomplete (of {len(statuses)} attempts)"
    )
    meta = [
        ("scenario", f"{_esc(h.scenario_id)} <span class='muted'>({_esc(scenario)})</span>"),
        ("strategy", _esc(h.strategy)),
        (
            "contract",
            f"source {_esc(str(contract.get('source', '-')))}, version "
            f"{_esc(str(contract.get('version', '-')))}, threshold <b>{_esc(str(threshold))}</b> "
            f"{_esc(str(contract.get('unit', 'nats')))}: a token mismatches when "
            "|training - rollout| &gt; threshold",
        ),
        (
            "run time",
            _esc(f"{_when(h.first_attempt)} to {_when(h.last_attempt)} (UTC, attempts shown)"),
        ),
        ("runtime", _esc(", ".join(h.runtimes) or "-")),
        ("run directory", f"<code>{_esc(h.run_dir)}</code>"),
        ("verify", verify),
    ]
    parts = [
        f"<header><h1>logprob drift: {_esc(h.experiment_id)}</h1><dl class='meta'>",
        "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in meta),
        "</dl>",
        _versions(h.environments),
        "<details><summary>verify status of every attempt</summary>",
        _table(
            ["case", "attempt", "status", "outcome / file", "detail"],
            (
                [s.case_id, s.attempt_id, s.status, s.outcome or s.file or "", s.detail]
                for s in statuses
            ),
            "sortable",
        ),
        "</details></header>",
    ]
    return "".join(parts)


def _when(attempt_id: str | None) -> str:
    if not attempt_id or len(attempt_id) < 16:
        return "-"
    t = attempt_id
    return f"{t[0:4]}-{t[4:6]}-{t[6:8]} {t[9:11]}:{t[11:13]}:{t[13:15]}"


def _versions(environments: Sequence[Mapping[str, Any]]) -> str:
    if not environments:
        return ""
    keys = sorted({k for e in environments for k in e})
    headers = ["package / environment"] + (
        ["value"] if len(environments) == 1 else [f"set {i + 1}" for i in range(len(environments))]
    )
    rows = [[k, *(str(e.get(k, "-")) for e in environments)] for k in keys]
    return (
        "<details open><summary>versions and environment (sealed)</summary>"
        + _table(headers, rows)
        + "</details>"
    )


# --------------------------------------------------------------------------- case table


def _case_table(data: ReportData) -> str:
    with_attr = data.attribution is not None
    headers = [
        "case",
        "outcome",
        "changed",
        "active",
        "mismatches",
        "max |diff|",
        "p99 |diff|",
        "mean |diff|",
        *(title for title, _ in PEER_METRICS),
    ]
    with_full = has_full_vocabulary(data)
    if with_full:
        headers += [title for title, _, _ in FULL_VOCAB_COLUMNS] + ["semantic offset"]
    if with_attr:
        headers += ["which side moved", "mean |diff| ratio", "95% interval", "p99 ratio"]
    headers += ["attempt (UTC)"]
    rows = []
    for view in data.cases:
        d = view.diagnostics
        label = (
            f"<a href='#{_anchor(view)}'>{_esc(view.label)}</a>"
            if view.detail is not None
            else _esc(view.label)
        )
        cells = [
            f"<td data-v='{_esc(view.label)}'>{label}</td>",
            f"<td class='outcome'>{_esc(view.outcome)}</td>",
            _td(", ".join(view.changed) or "(baseline)"),
            _td(_show(view.active_tokens), num=_num(view.active_tokens), cls="n"),
            _td(_show(view.mismatches), num=_num(view.mismatches), cls="n"),
        ]
        for key in ("max_abs_diff", "p99_abs_diff", "mean_abs_diff"):
            cells.append(_td(fmt_diff(d.get(key)), num=_num(d.get(key)), cls="n"))
        for _, key in PEER_METRICS:
            cells.append(_td(fmt_diff(d.get(key)), num=_num(d.get(key)), cls="n"))
        if with_full:
            *stats, (offset, _) = full_vocabulary_cells(d)
            cells += [_td(text, num=value, cls="n") for text, value in stats]
            cells.append(_td(offset, cls="words" if offset not in ("-", "no") else ""))
        if with_attr:
            entry = view.attribution or {}
            effect = entry.get("effect") or {}
            mean = effect.get("mean_ratio") or {}
            p99 = effect.get("p99_ratio") or {}
            cells += [
                _td(
                    entry.get("classification", "baseline" if not view.changed else "-"),
                    cls="words",
                ),
                _td(fmt_ratio(mean.get("value")), num=_num(mean.get("value")), cls="n"),
                _td(interval(mean)),
                _td(fmt_ratio(p99.get("value")), num=_num(p99.get("value")), cls="n"),
            ]
        attempt = view.attempt_id or "-"
        comparison = dict(view.files).get(layout.COMPARISON)
        cells.append(
            f"<td data-v='{_esc(attempt)}'><a href='{_esc(comparison)}' title='{_esc(attempt)}'>"
            f"{_esc(_when(attempt))}</a></td>"
            if comparison
            else _td(attempt)
        )
        rows.append(
            f"<tr class='o-{_esc(view.outcome)}' data-outcome='{_esc(view.outcome)}' "
            f"data-case='{_esc(view.case_id)}'>" + "".join(cells) + "</tr>"
        )
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    detailed = sum(1 for v in data.cases if v.detail is not None)
    return (
        f"<section id='cases'><h2>Cases ({len(data.cases)})</h2>"
        f"<p class='muted'>Click a column to sort. {detailed} case(s) have a detailed section "
        "below (linked); the others are summarized by their row.</p>"
        "<div class='scroll'><table id='case-table' class='sortable'><thead>"
        f"<tr>{head}</tr></thead><tbody>" + "".join(rows) + "</tbody></table></div></section>"
    )


def _show(value: Any) -> str:
    return "-" if value is None else str(value)


# --------------------------------------------------------------------------- attribution


def _attribution(data: ReportData, draw: bool) -> str:
    document = data.attribution
    if document is None:
        return ""
    parts = ["<section id='attribution'><h2>Attribution: which change moves the drift</h2>"]
    floor = document.get("noise_floor") or {}
    baseline = document.get("baseline") or {}
    parts.append(
        "<p>Each intervention against the baseline (attempt "
        f"<code>{_esc(str(baseline.get('attempt_id', '-')))}</code>) on the tokens both share. "
        + (
            f"Noise floor from {floor.get('repeats')} baseline repeat(s): rollout "
            f"{fmt_diff(floor.get('rollout_max_abs_delta'))}, training "
            f"{fmt_diff(floor.get('training_max_abs_delta'))}."
            if floor.get("measured")
            else "Noise floor not measured (one baseline execution; any movement counts)."
        )
        + "</p>"
    )
    if draw:
        svg = plots.attribution_svg(document)
        if svg is not None:
            rows = len(document.get("ranking", []))
            note = (
                f"<figcaption class='muted'>first {plots.ATTRIBUTION_MAX_ROWS} of {rows} "
                "interventions by rank; every one is in the table</figcaption>"
                if rows > plots.ATTRIBUTION_MAX_ROWS
                else ""
            )
            parts.append(f"<figure class='plot wide' data-plot='attribution'>{svg}{note}</figure>")
    ranking = document.get("ranking") or []
    if ranking:
        more = len(ranking) - RANKING_SHOWN
        parts.append(
            "<p><b>Ranked by effect on the drift:</b> "
            + " &gt; ".join(_esc(str(label)) for label in ranking[:RANKING_SHOWN])
            + (
                f" &gt; &hellip; ({more} more: sort the table by mean |diff| ratio)"
                if more > 0
                else ""
            )
            + "</p>"
        )
    for skipped in document.get("skipped") or []:
        parts.append(
            f"<p class='muted'>not attributed: {_esc(str(skipped.get('label')))}: "
            f"{_esc(str(skipped.get('reason')))}</p>"
        )
    parts.append("</section>")
    return "".join(parts)


def _invalid(data: ReportData) -> str:
    invalid = data.invalid
    if not invalid:
        return ""
    return (
        f"<section id='invalid'><h2 class='bad'>Invalid attempts ({len(invalid)})</h2>"
        "<p>These attempts failed verification (tampered, corrupt or inconsistent); nothing "
        "of them is plotted or counted.</p>"
        + _table(
            ["case", "attempt", "file", "detail"],
            ([s.case_id, s.attempt_id, s.file or "-", s.detail] for s in invalid),
        )
        + "</section>"
    )


# --------------------------------------------------------------------------- per case


def _token(text: str | None, token_id: int) -> str:
    shown = (text if text is not None else str(token_id)).replace("\n", "\u23ce")
    return _esc(shown)


def _worst(worst: Sequence[WorstToken], decoded: bool) -> str:
    rows = []
    for w in worst:
        context = (
            "<span class='ctx'>"
            + "".join(f"<code class='tok'>{_token(t, -1)}</code>" for t in w.before)
            + f"<mark>{_token(w.text, w.token_id)}</mark>"
            + "".join(f"<code class='tok'>{_token(t, -1)}</code>" for t in w.after)
            + "</span>"
        )
        rows.append(
            "<tr>"
            + _td(w.sample, cls="n")
            + _td(w.position, cls="n")
            + _td(w.token_id, cls="n")
            + f"<td>{context}</td>"
            + _td(f"{w.rollout:.6f}", cls="n")
            + _td(f"{w.training:.6f}", cls="n")
            + _td(fmt_diff(w.abs_diff), cls="n bad" if w.mismatch else "n")
            + "</tr>"
        )
    source = "decoded with the checkpoint's tokenizer" if decoded else "token ids (no tokenizer)"
    return (
        f"<h3>Worst tokens <span class='muted'>({source})</span></h3><table><thead><tr>"
        "<th>sample</th><th>position</th><th>id</th><th>token in context</th>"
        "<th>rollout</th><th>training</th><th>|diff|</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )


def _number(value: Any) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:.4g}"


def _stat_td(cell: tuple[str, float | None]) -> str:
    text, value = cell
    return _td(text, num=value if value is not None and value != float("inf") else None, cls="n")


def _offset(offset: Mapping[str, Any]) -> str:
    if not offset:
        return ""
    fires = bool(offset.get("fires"))
    explanation = offset.get("explanation")
    how = f" <span class='muted'>({_esc(str(explanation))})</span>" if explanation else ""
    return (
        f"<p class='offset'><b>Semantic offset:</b> "
        f"<span class='{'bad' if fires else 'muted'}'>{_esc(str(offset.get('message', '')))}"
        f"</span>{how}</p>"
    )


def _top_token(token: Mapping[str, Any], texts: Mapping[int, str]) -> str:
    token_id = int(token["token_id"])
    return _token(texts.get(token_id), token_id)


def _full_vocabulary(view: CaseView) -> str:
    """The full-vocabulary divergence of a detailed case: KL both ways and TV (mean / p99 /
    max), truncated supports, the worst positions with their top tokens, the semantic
    offset; or why they are unavailable; nothing when the case has none."""
    full, offset = entries({"diagnostics": view.diagnostics})
    if not full and not offset:
        return ""
    parts = ["<h3>Full-vocabulary divergence</h3>"]
    if "unavailable" in full:
        parts.append(f"<p class='muted'>unavailable: {_esc(str(full['unavailable']))}</p>")
        return "".join(parts) + _offset(offset)
    if full:
        head = "".join(f"<th>{_esc(s)}</th>" for s in STATISTICS)
        rows = "".join(
            f"<tr>{_td(name)}" + "".join(_stat_td(c) for c in cells) + "</tr>"
            for name, cells in reduction_rows(full)
        )
        parts.append(
            f"<p>Over {_esc(str(full.get('positions')))} active positions; supports differ "
            f"(truncation) at {_esc(str(full.get('truncated_positions')))}.</p>"
            f"<table class='divergence'><thead><tr><th></th>{head}</tr></thead>"
            f"<tbody>{rows}</tbody></table>"
        )
    parts.append(_offset(offset))
    worst = full.get("worst_positions") or []
    texts = view.detail.top_token_texts if view.detail is not None else {}
    if worst:
        body = []
        for w in worst:
            tokens = "".join(
                "<tr>"
                + _td(t.get("token_id"), cls="n")
                + f"<td><code class='tok'>{_top_token(t, texts)}</code></td>"
                + _td(_number(t.get("rollout_logprob")), cls="n")
                + _td(_number(t.get("training_logprob")), cls="n")
                + _td(_number(t.get("tv_share")), cls="n")
                + "</tr>"
                for t in w.get("top_tokens", [])
            )
            body.append(
                "<tr>"
                + _td(w.get("sample"), cls="n")
                + _td(w.get("position"), cls="n")
                + _td(_number(w.get("total_variation")), cls="n")
                + _td(_number(w.get("kl_rollout_training")), cls="n")
                + _td(_number(w.get("kl_training_rollout")), cls="n")
                + "<td><table class='top'><thead><tr><th>id</th><th>token</th>"
                "<th>rollout</th><th>training</th><th>TV share</th></tr></thead>"
                f"<tbody>{tokens}</tbody></table></td></tr>"
            )
        parts.append(
            "<table class='worst-positions'><thead><tr><th>sample</th><th>position</th>"
            "<th>TV</th><th>KL(r||t)</th><th>KL(t||r)</th>"
            "<th>top tokens (logprobs; share of the position's TV)</th></tr></thead><tbody>"
            + "".join(body)
            + "</tbody></table>"
        )
    return "".join(parts)


def _value(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def _records(view: CaseView) -> str:
    rows = []
    for r in view.records:
        knob = str(r.get("knob"))
        changed = knob in view.changed
        status = str(r.get("status", "-"))
        rows.append(
            f"<tr{' style=font-weight:600' if changed else ''}>"
            + _td(knob + (" (changed)" if changed else ""))
            + _td(r.get("lifecycle", "-"))
            + _td(_value(r.get("requested")))
            + _td(_value(r.get("materialized")))
            + _td(_value(r.get("actual")))
            + _td(status, cls="" if status == "applied" else "bad")
            + _td(r.get("evidence", ""))
            + "</tr>"
        )
    return (
        "<h3>Knobs: requested &rarr; materialized &rarr; actual</h3><table><thead><tr>"
        "<th>knob</th><th>lifecycle</th><th>requested</th><th>materialized</th><th>actual</th>"
        "<th>status</th><th>evidence</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )


def _identity(view: CaseView) -> str:
    detail = view.detail
    assert detail is not None
    rows = "".join(
        "<tr>"
        + _td(name)
        + _td(r)
        + _td(t)
        + _td("same" if same else "DIFFERS", cls="good" if same else "bad")
        + "</tr>"
        for name, r, t, same in detail.identity_checks
    )
    if view.identity_violations:
        verdict = (
            "<ul>"
            + "".join(f"<li class='bad'>{_esc(v)}</li>" for v in view.identity_violations)
            + "</ul>"
        )
    else:
        verdict = (
            "<p class='good'>No identity violation: checkpoint, tokenizer, token ids, "
            "attention and active masks, positions, packing and the read-only scorer state "
            "all matched.</p>"
        )
    evidence = detail.training_evidence
    before, after = evidence.get("state_digest_before"), evidence.get("state_digest_after")
    readonly = (
        f"<p>Training scorer state digest before/after scoring: "
        f"<span class='{'good' if before == after else 'bad'}'>"
        f"{'unchanged' if before == after else 'CHANGED'}</span> "
        f"<code>{_esc(str(before)[:16])}</code></p>"
        if before is not None
        else ""
    )
    return (
        "<h3>Identity checks</h3>"
        + verdict
        + readonly
        + "<table><thead><tr><th>field</th><th>rollout</th><th>training</th><th></th></tr>"
        f"</thead><tbody>{rows}</tbody></table>"
    )


def _files(view: CaseView) -> str:
    links = " &middot; ".join(
        f"<a href='{_esc(href)}'>{_esc(name)}</a>" for name, href in view.files
    )
    return (
        f"<p><b>Sealed files</b> (attempt <code>{_esc(str(view.attempt_id))}</code>): {links}</p>"
    )


def _case_section(view: CaseView, decades: tuple[int, int], draw: bool) -> str:
    detail = view.detail
    assert detail is not None
    threshold = float(view.threshold or 0.0)
    parts = [
        f"<article class='case' id='{_anchor(view)}' data-case='{_esc(view.case_id)}'>",
        f"<h2>{_esc(view.label)} {_badge(view.outcome)} "
        f"<small class='muted'>{_esc(view.case_id)}</small></h2>",
        f"<p>{_esc(view.reason)}</p>",
    ]
    if draw:
        figures = (
            ("histogram", plots.histogram_svg(detail.histogram, threshold, decades)),
            ("position", plots.profile_svg(detail.profile, threshold)),
            ("scatter", plots.scatter_svg(detail.scatter, threshold)),
        )
        parts.append(
            "<div class='plots'>"
            + "".join(
                f"<figure class='plot' data-plot='{name}' data-case='{_esc(view.case_id)}'>"
                f"{svg}</figure>"
                for name, svg in figures
            )
            + "</div>"
        )
    parts += [
        _worst(detail.worst, detail.decoded),
        _full_vocabulary(view),
        _records(view),
        _identity(view),
        _files(view),
        "</article>",
    ]
    return "".join(parts)


# --------------------------------------------------------------------------- the page


def render_page(data: ReportData) -> str:
    """The whole page as one string."""
    draw = plots.available()
    detailed = [v for v in data.cases if v.detail is not None]
    decades = plots.histogram_decades(
        [v.detail.histogram for v in detailed if v.detail is not None],
        [float(v.threshold) for v in detailed if v.threshold],
    )
    threshold = _num(data.header.contract.get("threshold"))
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>logprob drift: {_esc(data.header.experiment_id)}</title>"
        f"<style>{STYLE}</style></head><body>",
        _header(data),
    ]
    if not draw:
        parts.append(
            "<p class='bad'>matplotlib is not installed: no plots (install the "
            "<code>report</code> extra: <code>pip install 'pytest-logprob-drift[report]'</code>)."
            "</p>"
        )
    else:
        overview = plots.overview_svg(data.cases, threshold)
        if overview is not None:
            parts.append(
                f"<section id='overview'><figure class='plot wide' data-plot='overview'>"
                f"{overview}</figure></section>"
            )
    parts += [_case_table(data), _attribution(data, draw), _invalid(data)]
    if detailed:
        parts.append("<section id='details'>")
        parts += [_case_section(v, decades, draw) for v in detailed]
        parts.append("</section>")
    summarized = [v for v in data.cases if v.detail is None and v.attempt_id is not None]
    if summarized:
        parts.append(
            f"<p class='muted'>{len(summarized)} case(s) without a detailed section (limit "
            f"{data.detailed_limit}): see their rows in the table; their sealed files are "
            "linked from the attempt column.</p>"
        )
    parts.append(
        "<section id='notes'><h2>How the plots aggregate</h2><ul>"
        + "".join(f"<li>{_esc(n)}</li>" for n in data.notes)
        + "</ul></section>"
    )
    parts.append(f"<script>{SORT_SCRIPT}</script></body></html>\n")
    return "".join(parts)
