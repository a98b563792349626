"""The report never runs what a run directory says (issue 21, classes 1 and 8).

A real S0 smoke run is made hostile the way anyone who can write an unkeyed run can: a case
directory renamed to a name with quotes and markup (its seal rewritten to match), a field of
the sealed attribution rewritten to markup and the file re-sealed, the whole run moved under a
directory whose name reads as a ``javascript:`` URL, and token text (from the tokenizer a
frontend hands in) holding markup, ``</script>``, bidi overrides and terminal escapes, and a case
label holding markup (in its comparison.json and the attribution). The token view, the findings
and the overview's hover text show them as text. The page's markup is checked without a
browser; loaded in headless Chromium (a slow test): no script runs (the payloads would set
``document.title``, a global and call ``console.error``), no element or handler is injected,
no request leaves the page, every link resolves to a file of the run or to the page itself,
and the page says that ``verify`` rejects the attribution.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from drift_testing import OFFSET_LABEL, cli, copy_of_s0
from report_browser import live_page, open_page
from resealing import reseal

from pytest_logprob_drift.attribution.sealed import attribution_dirs
from pytest_logprob_drift.report.page import publish_report
from pytest_logprob_drift.store.attempt import execution_key
from pytest_logprob_drift.store.run import iter_attempt_dirs

PAYLOAD = (
    "<img src=x onerror=\"window.pwned=1;document.title='pwned';console.error('pwned')\">"
    "<script>window.pwned=2;document.title='pwned';console.error('pwned')</script>"
)
CASE_NAME = "c'\"><svg onload=window.pwned=3><img src=x onerror=window.pwned=4>"
"""A case directory name (no ``/``: it is one path component)."""
SCHEME_DIR = Path("javascript:alert(1)") / "x"
"""``javascript:alert(1)//x``: relative links through it would read as a URL scheme."""
TOKENS = (
    "<img src=x onerror=window.pwned=5>",
    "</code><script>window.pwned=6</script>",
    "ab\u202edcba\u2066x\u2069",
    "\x1b]0;title\x07\x1b[2J",
    "&lt;plain&gt;",
    "</script><script>window.pwned=7</script>",
)
LABEL = "<b onmouseover=window.pwned=8>x</b></script><script>window.pwned=9</script>"
"""The offset case's label, rewritten in its comparison.json and in the attribution."""
TITLE = "logprob drift: s0-cpu-smoke"

_PROBE = """
(() => {
  const all = [...document.querySelectorAll("*")];
  const counts = {};
  for (const e of all) counts[e.localName] = (counts[e.localName] || 0) + 1;
  const handlers = [], links = [];
  for (const e of all) {
    for (const a of e.attributes) {
      const name = a.name.toLowerCase();
      if (name.startsWith("on")) handlers.push(e.localName + " " + name);
      if (["href", "src", "xlink:href", "action", "formaction"].includes(name)) {
        links.push(new URL(a.value, document.baseURI).href);
      }
    }
  }
  const anchors = [...document.querySelectorAll("a[href^='#']")].map(
    (a) => !!document.getElementById(decodeURIComponent(a.hash.slice(1))));
  return {title: document.title, pwned: window.pwned === undefined ? null : window.pwned,
          counts, handlers, links, anchors, text: document.body.innerText,
          scripts: [...document.querySelectorAll("script")].map((s) => s.type),
          findings: [...document.querySelectorAll("#findings li")].map((li) => li.textContent),
          ticks: [...document.querySelectorAll("figure[data-plot='overview'] svg title")].map(
            (t) => t.textContent),
          articles: [...document.querySelectorAll("article.case")].map((a) => a.dataset.case)};
})()
"""


def _writable(path: Path) -> None:
    path.chmod(0o644)


def _reseal(directory: Path, **fields: Any) -> None:
    """Rewrite ``directory``'s COMPLETE (an attempt's or an attribution's) with every file's
    plain SHA-256 recomputed and ``fields`` replaced: what an unkeyed run allows anyone."""
    seal = directory / "COMPLETE"
    document: dict[str, Any] = json.loads(seal.read_text())
    document.update(fields)
    document["files"] = {
        name: hashlib.sha256((directory / name).read_bytes()).hexdigest()
        for name in document["files"]
    }
    _writable(seal)
    seal.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")


def _renamed(value: Any, old: str, new: str) -> Any:
    """``value`` with every string equal to ``old`` replaced by ``new``."""
    if isinstance(value, dict):
        return {k: _renamed(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_renamed(v, old, new) for v in value]
    return new if value == old else value


def _hostile_decoder(checkpoint: Mapping[str, Any]) -> Any:
    def decode(ids: Sequence[int]) -> list[str]:
        return [TOKENS[i % len(TOKENS)] for i in ids]

    return decode


@pytest.fixture(scope="module")
def clean_run(sealed_s0: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_of_s0(sealed_s0, tmp_path_factory.mktemp("report-injection")) / "s0-cpu-smoke"


@pytest.fixture(scope="module")
def hostile_run(clean_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    run_dir = root / SCHEME_DIR / clean_run.name
    shutil.copytree(clean_run, run_dir)
    # A case directory with markup in its name, its seal rewritten to name it.
    offset = next(
        a
        for a in iter_attempt_dirs(run_dir)
        if json.loads((a / "comparison.json").read_text())["label"] == OFFSET_LABEL
    )
    for name in ("comparison.json", "requested.json", "identity.json"):
        path = offset / name
        document = _renamed(json.loads(path.read_text()), offset.parent.name, CASE_NAME)
        if name == "comparison.json":
            document["label"] = LABEL
        _writable(path)
        path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    payload = json.loads((offset / "identity.json").read_text())["execution_key_payload"]
    _writable(offset.parent)
    renamed = offset.parent.rename(offset.parent.with_name(CASE_NAME))
    _reseal(renamed / offset.name, case_id=CASE_NAME, execution_key=execution_key(payload))
    # ...and the plan's row of that case renamed and relabelled too (verify refuses an attempt
    # of a case the plan never had, or under another label), plan.jsonl re-sealed.
    plan = run_dir / "plan.jsonl"
    rows = [json.loads(line) for line in plan.read_text().splitlines()]
    for row in rows:
        if row["case_id"] == offset.parent.name:
            row["case_id"], row["label"] = CASE_NAME, LABEL  # verify checks both against it
    _writable(plan)
    plan.write_text(
        "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in rows)
    )
    reseal(run_dir, plan)
    # A field of the attribution document rewritten to markup, the file re-sealed.
    directory = attribution_dirs(run_dir)[0]
    path = directory / "attribution.json"
    document = json.loads(path.read_text())
    document["noise_floor"] = {  # numbers only: a string here is not an attribution at all
        "measured": True,
        "repeats": 0,
        "rollout_max_abs_delta": 0.0,
        "training_max_abs_delta": 0.0,
    }
    document["skipped"] = [{"label": PAYLOAD, "reason": PAYLOAD}]
    # (an unknown member, e.g. ``baseline.label``, is refused where the document is decoded:
    # the attribution would not be shown at all; markup goes where the type has strings)
    document["ranking"] = _renamed(document["ranking"], OFFSET_LABEL, LABEL)
    document["cases"] = _renamed(
        _renamed(document["cases"], OFFSET_LABEL, LABEL), offset.parent.name, CASE_NAME
    )
    _writable(path)
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    _reseal(directory)
    return run_dir


@pytest.fixture(scope="module")
def hostile_page(hostile_run: Path) -> Path:
    """The hostile run's page, written once (the browser test and the markup test read it)."""
    root = hostile_run.parents[len(SCHEME_DIR.parts)]
    page = root / "page.html"
    published = publish_report(hostile_run, page, decoder_factory=_hostile_decoder)
    assert published.written
    return page


@pytest.mark.slow
def test_the_hostile_page_holds_the_payloads_only_as_escaped_text(hostile_page: Path) -> None:
    """Without a browser: no raw bidi override or terminal escape, no payload's markup."""
    html = hostile_page.read_text(encoding="utf-8")
    assert "\u202e" not in html and "\x1b" not in html and "\\u202e" in html
    assert "<script>window.pwned" not in html and "</b></script>" not in html
    assert html.count("<script") == 2  # the token data and the page's one script


@pytest.mark.slow  # a browser
def test_a_hostile_run_runs_no_script_and_injects_nothing(
    hostile_run: Path, hostile_page: Path
) -> None:
    page = hostile_page
    html = page.read_text(encoding="utf-8")
    assert "\u202e" not in html and "\x1b" not in html and "\\u202e" in html
    check = open_page(page, "report-hostile.png", probe=_PROBE)
    probe = check.probe
    # The vectors are on the page: the renamed case has its detailed section and anchor.
    assert CASE_NAME in probe["articles"], probe["articles"]
    assert probe["anchors"] and all(probe["anchors"])
    # No script ran.
    assert probe["title"] == TITLE and probe["pwned"] is None
    assert check.console_errors == []
    # No element or handler was injected.
    assert probe["scripts"] == ["application/json", ""]  # token data, then the one script
    assert "<script>window.pwned" not in html and "</b></script>" not in html
    assert "img" not in probe["counts"] and "iframe" not in probe["counts"]
    assert probe["handlers"] == []
    assert probe["counts"]["svg"] == len([p for p in check.plots if p["svg"]])
    # No request left the page; every link is a file of the run or a place on the page.
    assert check.external_requests(page) == []
    for url in probe["links"]:
        if url.startswith("data:image/png;base64,"):  # a rasterized scatter layer
            continue
        parts = urlsplit(url)
        assert parts.scheme == "file", url
        target = Path(unquote(parts.path))
        assert target == page.resolve() or target.is_relative_to(hostile_run.resolve()), url
        assert target.is_file(), url
    # What the run says is shown as text, and the attribution as rejected.
    text = probe["text"]
    assert PAYLOAD in text and CASE_NAME in text and TOKENS[0] in text
    assert "\\u202e" in text and "\u202e" not in text
    assert "Rejected by verify" in text
    # The new elements show it as text too: token view, findings, the overview's hover text.
    with live_page(page) as live:
        assert live.draw_tokens() == len(probe["articles"])
        tokens = live.evaluate(
            "[...document.querySelectorAll('div.tokens .tk')].map((t) => t.textContent)"
        )
        hovered = live.evaluate(
            "(() => { const t = document.querySelector('div.tokens .tk');"
            " t.focus(); return document.querySelector('div.tokens .token-info').textContent; })()"
        )
        after = live.evaluate(_PROBE)
        assert live.console_errors() == []
    assert TOKENS[1] in tokens and TOKENS[5] in tokens and TOKENS[0] in tokens
    assert TOKENS[2] not in tokens and "ab\\u202edcba\\u2066x\\u2069" in tokens
    assert hovered.startswith("sample 0, position 0: ")
    assert after["pwned"] is None and after["title"] == TITLE and after["handlers"] == []
    assert after["counts"] == {**probe["counts"], "span": after["counts"]["span"]}
    assert any(item.startswith(LABEL + " moved the training side") for item in probe["findings"])
    assert LABEL in probe["ticks"]
    assert f"not attributed: {PAYLOAD}: {PAYLOAD}" in text


def test_the_terminal_says_the_attribution_does_not_verify(hostile_run: Path) -> None:
    code, out, err = cli("report", hostile_run, "--no-html")
    assert code == 0, err
    assert "the sealed attribution above does not verify" in out
    code, out, _ = cli("verify", hostile_run)
    assert code == 1


@pytest.mark.slow
def test_a_verified_attribution_is_not_marked(clean_run: Path, tmp_path: Path) -> None:
    page = tmp_path / "clean.html"
    code, out, err = cli("report", clean_run, "--html", page)
    assert code == 0, err
    assert "does not verify" not in out
    html = page.read_text()
    assert "Rejected by verify" not in html and "Attribution: which change moves" in html
