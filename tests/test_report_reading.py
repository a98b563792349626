"""The report read as its users read it (issue 26): the answer first, every token one hover away,
nothing cut off.

Two sealed runs (``tests/data/pre_issue20``: the cpu-smoke S0 run, where one intervention moves
the training side and one has no effect, and the transformers S0 run on the tiny Qwen3, whose
tokenizer decodes the tokens) are reported through the CLI and their pages loaded in headless
Chromium at 1280 x 800. What the findings, ``--json`` and the token view say is checked against
the sealed files read in the test itself (the attribution document with its digest checked
against its seal; the logprobs from ``token_diffs.pt`` with ``torch.load``), never against the
report's own code.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import cli
from materiality_by_hand import by_hand
from report_browser import LivePage, live_page

from pytest_logprob_drift.report import token_view as tv
from pytest_logprob_drift.report.markup import json_script
from pytest_logprob_drift.report.plots import LABEL_LINE, LABEL_LINES, wrap_label

DATA = Path(__file__).parent / "data" / "pre_issue20" / "runs"
RUNS = ("fixture-pre20-cpu-smoke", "fixture-pre20-hf", "long-labels")
LONG = "training.attention_backend=" + "flash_attention_" * 6 + "x" * 60
"""A case label rewritten into the cpu-smoke run (``long-labels``): long, with and without
places to break."""
WIDTH, HEIGHT = 1280, 800


def _sealed_attribution(run_dir: Path) -> dict[str, Any]:
    """The run's one sealed attribution document, its bytes checked against its seal."""
    (directory,) = sorted((run_dir / "attributions").iterdir())
    seal = json.loads((directory / "COMPLETE").read_text())
    raw = (directory / "attribution.json").read_bytes()
    assert hashlib.sha256(raw).hexdigest() == seal["files"]["attribution.json"]
    document: dict[str, Any] = json.loads(raw)
    return document


def _side_in_words(classification: str) -> str | None:
    """Which side the sealed classification says moved (its own words)."""
    if "moved both" in classification:
        return "both"
    for side in ("rollout", "training"):
        if f"moved the {side} side" in classification:
            return side
    return None


def _expected_movers(document: dict[str, Any]) -> list[tuple[str, str]]:
    """``(label, side)`` of the interventions the sealed document says moved a side, in its
    ranking order; checked against the movement numbers and the noise floor as well."""
    by_label = {c["label"]: c for c in document["cases"]}
    floor = document["noise_floor"]
    movers = []
    for label in document["ranking"]:
        entry = by_label[label]
        side = _side_in_words(entry["classification"])
        rollout = entry["rollout"]["max_abs_delta"] > floor["rollout_max_abs_delta"]
        training = entry["training"]["max_abs_delta"] > floor["training_max_abs_delta"]
        numbers = {(True, True): "both", (True, False): "rollout", (False, True): "training"}
        assert side == numbers.get((rollout, training)), entry
        if side is not None:
            movers.append((label, side))
    return movers


def _relabel(run_dir: Path, label: str, new: str) -> None:
    """Rewrite one case's label in its comparison.json and its plan row, and re-seal the
    attempt's plain SHA-256 manifest and the run seal (what an unkeyed run allows anyone; the
    attribution then no longer verifies)."""
    for comparison in run_dir.glob("cases/*/*/comparison.json"):
        document = json.loads(comparison.read_text())
        if document["label"] != label:
            continue
        document["label"] = new
        comparison.chmod(0o644)
        comparison.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
        seal = comparison.parent / "COMPLETE"
        manifest = json.loads(seal.read_text())
        manifest["files"]["comparison.json"] = hashlib.sha256(comparison.read_bytes()).hexdigest()
        seal.chmod(0o644)
        seal.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        _relabel_plan(run_dir, document["case_id"], new)
        return
    raise AssertionError(f"no case labelled {label}")


def _relabel_plan(run_dir: Path, case_id: str, new: str) -> None:
    """The case's plan row gets the label too (verify holds the plan's label and the
    attempt's to each other), and the run seal is recomputed."""
    from resealing import reseal

    plan = run_dir / "plan.jsonl"
    rows = [json.loads(line) for line in plan.read_text().splitlines()]
    for row in rows:
        if row["case_id"] == case_id:
            row["label"] = new
    plan.chmod(0o644)
    for seal in (run_dir / "seals").iterdir():
        seal.chmod(0o644)
    (run_dir / "seals").chmod(0o755)
    plan.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))
    reseal(run_dir, plan)


@pytest.fixture(scope="module", params=RUNS)
def reported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A copy of a sealed run, its page, its terminal report and its ``--json``."""
    base = tmp_path_factory.mktemp(request.param)
    run_dir = base / request.param
    if request.param == "long-labels":
        shutil.copytree(DATA / RUNS[0], run_dir)
        _relabel(run_dir, "batch.size=1", LONG)
    else:
        shutil.copytree(DATA / request.param, run_dir)
    page = base / "page.html"
    code, out, err = cli("report", run_dir, "--html", page)
    assert code == 0, err
    code, as_json, err = cli("report", run_dir, "--html", page, "--json")
    assert code == 0, err
    return {"run_dir": run_dir, "page": page, "out": out, "json": json.loads(as_json)}


@pytest.mark.slow
def test_the_findings_name_exactly_the_sealed_movers_in_rank_order(reported: Any) -> None:
    document = _sealed_attribution(reported["run_dir"])
    within = by_hand(reported["run_dir"])["within"]
    movers = [(label, side) for label, side in _expected_movers(document) if label not in within]
    assert movers  # each run has a material intervention that moved a side
    others = [
        label for label in document["ranking"] if label not in dict(movers) and label not in within
    ]
    # The terminal: the findings come first, before the case table.
    lines = reported["out"].splitlines()
    outcomes = [c["outcome"] for c in reported["json"]["cases"]]
    assert lines[0].startswith(f"{len(outcomes)} case(s): ")
    for outcome in set(outcomes):
        assert f"{outcomes.count(outcome)} {outcome}" in lines[0]
    sentence = lines[1]
    named = sentence.split("ranked by effect on the drift: ", 1)[1].rstrip(".").split(", ")
    assert named == [f"{label} ({side})" for label, side in movers]
    assert f"{len(movers)} of {len(document['ranking'])} intervention(s)" in sentence
    listed = [re.match(r"  (\d+)\. (.*)", line) for line in lines[2 : 2 + len(movers)]]
    for match, (label, side) in zip(listed, movers, strict=True):
        assert match is not None
        words = "both sides" if side == "both" else f"the {side} side"
        assert match.group(2).startswith(f"{label} moved {words}"), match.group(2)
    for label in others:
        assert label not in "\n".join(lines[: 2 + len(movers)])
    # The page says the same, at the top.
    html = reported["page"].read_text()
    start = html.index("id='findings'")
    block = html[start : html.index("</section>", start)]
    assert re.findall(r"<li value='\d+' data-label='([^']*)' data-side='(\w+)'>", block) == movers
    assert html.index("id='findings'") < html.index("data-plot='overview'")
    # --json carries the same findings.
    found = reported["json"]["findings"]
    assert [(f["label"], f["side"]) for f in found["moved"]] == movers
    # the material interventions that moved nothing, and those within the contract (never
    # ranked, whatever they moved), are listed apart in ranking order
    assert found["unmoved"] == others
    assert found["within_contract"] == within
    assert found["sentence"] == sentence


@pytest.mark.slow  # the reported run's page is drawn
def test_report_json_carries_each_sealed_attribution_entry(reported: Any) -> None:
    document = _sealed_attribution(reported["run_dir"])
    entries = {c["case_id"]: c for c in document["cases"]}
    cases = reported["json"]["cases"]
    assert {c["case_id"] for c in cases if c["attribution"] is not None} == set(entries)
    for case in cases:
        entry = entries.get(case["case_id"])
        assert case["attribution"] == entry
        expected = None if entry is None else _side_in_words(entry["classification"])
        assert case["side_moved"] == expected
        if entry is not None:  # what a script wants: side, classification, effect, divergence
            assert case["attribution"]["effect"]["mean_ratio"].keys() >= {"value", "low", "high"}
            assert "first_divergence" in case["attribution"]
    baseline = document["baseline"]["case_id"]
    assert next(c for c in cases if c["case_id"] == baseline)["attribution"] is None


# --------------------------------------------------------------------------- in the browser

_CASE_TABLE_OVERFLOW = """
(() => {
  const width = document.documentElement.clientWidth;
  const table = document.getElementById("case-table");
  const over = [table, ...table.querySelectorAll("*")]
    .filter((e) => e.getClientRects().length && e.getBoundingClientRect().right > width + 0.5)
    .map((e) => e.localName + " " + e.textContent.slice(0, 40));
  const visible = [...table.tHead.rows[0].cells].filter((c) => c.offsetParent !== null);
  return {width, over, visible: visible.map((c) => c.textContent),
          all: table.tHead.rows[0].cells.length, scroll: document.documentElement.scrollWidth};
})()
"""

_TICK_LABELS = """
(() => {
  const svg = document.querySelector("figure[data-plot='overview'] svg");
  const box = svg.getBoundingClientRect();
  return [...svg.querySelectorAll("g > title")].map((title) => {
    const text = title.parentNode.querySelector("text");
    const r = text.getBoundingClientRect();
    return {title: title.textContent, text: text.textContent,
            inside: r.left >= box.left - 0.5 && r.right <= box.right + 0.5 &&
                    r.top >= box.top - 0.5 && r.bottom <= box.bottom + 0.5,
            box: [r.left, r.top, r.right, r.bottom],
            svg: [box.left, box.top, box.right, box.bottom]};
  });
})()
"""


@pytest.mark.slow
def test_the_page_reads_at_1280_by_800(reported: Any) -> None:
    labels = sorted(c["label"] for c in reported["json"]["cases"])
    with live_page(reported["page"], width=WIDTH, height=HEIGHT) as page:
        findings = page.evaluate(
            "(() => { const r = document.getElementById('findings').getBoundingClientRect();"
            " return [r.top, r.bottom]; })()"
        )
        assert 0 <= findings[0] < findings[1] <= HEIGHT, findings  # above the fold
        table = page.evaluate(_CASE_TABLE_OVERFLOW)
        assert table["width"] == WIDTH and table["over"] == [], table
        assert table["scroll"] <= WIDTH, table  # nothing on the page scrolls sideways
        default = table["visible"]
        assert {"which side moved", "mean |diff| ratio", "95% interval"} <= set(default)
        assert len(default) < table["all"]
        page.evaluate("document.getElementById('more-columns').click()")
        shown = page.evaluate(_CASE_TABLE_OVERFLOW)["visible"]
        assert len(shown) == table["all"] and "p99 |diff|" in shown
        assert page.evaluate("document.getElementById('more-columns').ariaPressed") == "true"
        ticks = page.evaluate(_TICK_LABELS)
        assert sorted(t["title"] for t in ticks) == labels  # the full label on hover
        for tick in ticks:
            assert tick["inside"], tick
            flat = tick["text"].replace("\u2026", "")
            assert tick["title"].startswith(flat) or flat in tick["title"], tick
        page.screenshot(f"report-1280-{reported['run_dir'].name}.png")
        assert page.console_errors() == []


def _sealed_tokens(run_dir: Path, case_id: str) -> dict[str, torch.Tensor]:
    (attempt,) = sorted((run_dir / "cases" / case_id).iterdir())
    seal = json.loads((attempt / "COMPLETE").read_text())
    tensors = {}
    for name in ("token_diffs.pt", "score_rollout.pt"):
        raw = (attempt / name).read_bytes()
        assert hashlib.sha256(raw).hexdigest() == seal["files"][name]
        tensors[name] = torch.load(attempt / name, weights_only=True)
    diffs, batch = tensors["token_diffs.pt"], tensors["score_rollout.pt"]
    return {**diffs, "token_ids": batch["token_ids"], "prompt_lengths": batch["prompt_lengths"]}


_INFO = re.compile(
    r"sample (\d+), position (\d+): (\".*\") \(id (\d+)\)  rollout (\S+)  training (\S+)  "
    r"\|diff\| (\S+)(  MISMATCH)?"
)


def _check_info(info: str, sealed: dict[str, torch.Tensor]) -> tuple[int, int]:
    """The token the info line describes, its numbers against the sealed tensors (float64)."""
    match = _INFO.match(info)
    assert match, info
    sample, position = int(match.group(1)), int(match.group(2))
    column = int(sealed["prompt_lengths"][sample]) + position
    assert bool(sealed["active_mask"][sample, column])
    rollout = float(sealed["rollout_logprobs"][sample, column].to(torch.float64))
    training = float(sealed["training_logprobs"][sample, column].to(torch.float64))
    diff = abs(training - rollout)
    assert int(match.group(4)) == int(sealed["token_ids"][sample, column])
    assert math.isclose(float(match.group(5)), rollout, rel_tol=1e-8, abs_tol=1e-12)
    assert math.isclose(float(match.group(6)), training, rel_tol=1e-8, abs_tol=1e-12)
    assert math.isclose(float(match.group(7)), diff, rel_tol=6e-4, abs_tol=0.0)
    threshold = float(sealed["threshold"])
    assert (match.group(8) is not None) == (diff > threshold)
    return sample, position


_TOKEN_BOX = """
((index) => {
  const box = document.querySelector("div.tokens");
  const span = box.querySelectorAll(".line .tk")[index];
  span.scrollIntoView({block: "center"});
  const r = span.getBoundingClientRect();
  return {case: box.dataset.case, x: r.left + r.width / 2, y: r.top + r.height / 2,
          count: box.querySelectorAll(".tk").length};
})
"""


def _info(page: LivePage) -> str:
    text: str = page.evaluate("document.querySelector('div.tokens .token-info').textContent")
    return text


@pytest.mark.slow
def test_a_token_shows_its_logprobs_on_hover_and_on_keyboard_focus(reported: Any) -> None:
    run_dir = reported["run_dir"]
    with live_page(reported["page"], width=WIDTH, height=HEIGHT) as page:
        undrawn = page.evaluate("document.querySelectorAll('div.tokens .tk').length")
        assert page.draw_tokens() >= 1
        first = page.evaluate(f"{_TOKEN_BOX}(0)")
        sealed = _sealed_tokens(run_dir, first["case"])
        # Every active token of each shown sample is drawn (these runs fit the limits), when
        # its view comes near the window (none is drawn below the fold at load).
        assert first["count"] == int(sealed["active_mask"].sum())
        assert undrawn < page.evaluate("document.querySelectorAll('div.tokens .tk').length")
        hovered = page.evaluate(f"{_TOKEN_BOX}(3)")
        page.hover(hovered["x"], hovered["y"])
        assert _check_info(_info(page), sealed) == (0, 3)
        # Keyboard: one Tab stop per sample line, arrow keys within it.
        page.evaluate("document.querySelector('div.tokens .line .tk').focus()")
        assert _check_info(_info(page), sealed) == (0, 0)
        page.press("ArrowRight", "ArrowRight", 39)
        assert _check_info(_info(page), sealed) == (0, 1)
        page.press("Tab", "Tab", 9)
        focused = page.evaluate(
            "[document.activeElement.className, document.activeElement.parentNode.dataset.sample]"
        )
        assert focused[0].startswith("tk") and focused[1] == "1", focused
        assert _check_info(_info(page), sealed) == (1, 0)
        marked = page.evaluate(
            "[...document.querySelectorAll('div.tokens')].map((b) => [b.dataset.case,"
            " [...b.querySelectorAll('.tk')].map((t) => t.className),"
            " b.querySelector('p.muted').textContent])"
        )
        assert page.console_errors() == []
    # Coloured on the stated log scale (10 steps), mismatches outlined and the first of each
    # sample marked, as the sealed tensors say.
    for case_id, classes, legend in marked:
        scale = re.match(r"\|diff\| colour, log scale 1e(-?\d+) +1e(-?\d+) ", legend)
        assert scale, legend
        low, high = int(scale.group(1)), int(scale.group(2))

        def step(d: float, low: int = low, high: int = high) -> str:
            if d == 0:
                return ""
            return f" d{max(0, min(9, math.floor((math.log10(d) - low) / (high - low) * 10)))}"

        sealed = _sealed_tokens(run_dir, case_id)
        active = sealed["active_mask"]
        diff = (
            sealed["training_logprobs"].to(torch.float64)
            - sealed["rollout_logprobs"].to(torch.float64)
        ).abs()
        expected = []
        for sample in range(int(active.shape[0])):
            over = diff[sample][active[sample]] > float(sealed["threshold"])
            firsts = [
                i == int(over.nonzero()[0]) if bool(over.any()) else False
                for i in range(int(over.numel()))
            ]
            values = diff[sample][active[sample]].tolist()
            expected += [
                "tk" + step(d) + (" mm" if bool(m) else "") + (" first" if f else "")
                for d, m, f in zip(values, over.tolist(), firsts, strict=True)
            ]
        assert classes == expected, case_id


# --------------------------------------------------------------------------- pieces


def test_json_script_keeps_markup_out_of_the_block() -> None:
    hostile = {"t": "</script><script>alert(1)</script><!-- & \u2028", "</script>": 1}
    block = json_script("token-data", hostile)
    body = block[block.index(">") + 1 : block.rindex("</script>")]
    assert "<" not in body and ">" not in body and "&" not in body
    assert json.loads(body) == hostile
    with pytest.raises(ValueError, match="not an element id"):
        json_script("x' onload='y", {})


@pytest.mark.parametrize(
    "label",
    [
        "baseline",
        "training.attention_backend=eager",
        "rollout.tensor_parallel_size=2,training.sharding=fsdp",
        "x" * 100,
        "c'\"><svg onload=window.pwned=3>",
    ],
)
def test_wrapped_labels_fit_their_lines_and_keep_what_fits(label: str) -> None:
    wrapped = wrap_label(label)
    lines = wrapped.split("\n")
    assert len(lines) <= LABEL_LINES and all(len(line) <= LABEL_LINE for line in lines)
    joined = "".join(lines)
    if len(label) <= LABEL_LINE:
        assert wrapped == label
    elif joined.endswith("\u2026"):
        assert label.startswith(joined[:-1])
    else:
        assert joined == label


def test_the_token_view_keeps_its_limits_and_the_first_mismatch() -> None:
    samples, response, prompt = 20, 3 * tv.MAX_TOKENS, 5
    generator = torch.Generator().manual_seed(26)
    width = prompt + response
    rollout = -torch.rand((samples, width), generator=generator).to(torch.bfloat16)
    noise = torch.rand((samples, width), generator=generator) * 1e-4
    training = (rollout.to(torch.float32) + noise).to(torch.float32)
    active = torch.zeros((samples, width), dtype=torch.bool)
    active[:, prompt:] = True
    first = {3: 400, 7: 10, 11: response - 5}  # samples with one mismatch, at that position
    for sample, position in first.items():
        training[sample, prompt + position] += 0.5
    view = tv.token_view(
        token_ids=torch.arange(samples * width).view(samples, width),
        rollout=rollout,
        training=training,
        active=active,
        starts=torch.full((samples,), prompt),
        threshold=1e-3,
        texts=lambda ids: None,
    )
    assert view is not None and view.total_samples == samples and view.texts == {}
    peaks = (training.to(torch.float64) - rollout.to(torch.float64)).abs().amax(dim=1)
    worst = sorted(sorted(range(samples), key=lambda i: (-float(peaks[i]), i))[: tv.MAX_SAMPLES])
    assert [s.sample for s in view.samples] == worst
    for s in view.samples:
        assert s.positions.size == tv.MAX_TOKENS and s.length == response
        assert s.rollout.dtype.name == "float32"  # bfloat16 and float32 are exact in it
        position = first.get(s.sample)
        assert s.first_mismatch == position
        if position is not None:
            start = max(0, min(position - tv.LEAD, response - tv.MAX_TOKENS))
            assert int(s.positions[0]) == start and position in s.positions.tolist()
        column = prompt + s.positions
        assert (s.training.astype("float64") == training[s.sample, column].double().numpy()).all()
        assert (s.rollout.astype("float64") == rollout[s.sample, column].double().numpy()).all()


@pytest.mark.parametrize(
    ("rollout", "training", "side"),
    [
        (1e-3, 1e-3, None),  # both within the floor (2e-3, 3e-3): noise
        (5e-3, 1e-3, "rollout"),
        (1e-3, 4e-3, "training"),
        (5e-3, 4e-3, "both"),
    ],
)
def test_a_side_moved_only_above_the_noise_floor(rollout: Any, training: Any, side: Any) -> None:
    from pytest_logprob_drift.report.findings import moved_side
    from tests import attribution_records as records

    floor = {"measured": True, "rollout_max_abs_delta": 2e-3, "training_max_abs_delta": 3e-3}
    entry = records.case_data(
        "a", rollout=records.movement(rollout), training=records.movement(training)
    )
    document = records.attribution([entry], ["a"], noise_floor=floor | {"repeats": 0})
    moved = moved_side(document.cases[0], document.noise_floor)
    assert (None if moved is None else moved.value) == side


@pytest.mark.slow
def test_without_a_sealed_attribution_the_findings_say_so(tmp_path: Path) -> None:
    run_dir = tmp_path / RUNS[0]
    shutil.copytree(DATA / RUNS[0], run_dir)
    shutil.rmtree(run_dir / "attributions")
    code, out, err = cli("report", run_dir, "--html", tmp_path / "page.html", "--json")
    assert code == 0, err
    document = json.loads(out)
    assert document["findings"]["attributed"] is False and document["findings"]["moved"] == []
    assert all(c["attribution"] is None and c["side_moved"] is None for c in document["cases"])
    code, out, err = cli("report", run_dir, "--html", tmp_path / "page.html")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "3 case(s): 2 PASS, 1 MISMATCH."
    assert lines[1] == "No sealed attribution: which side moved is not known."
    html = (tmp_path / "page.html").read_text()
    assert "No sealed attribution: which side moved is not known." in html
    assert "which side moved</th>" not in html  # no attribution columns without one
