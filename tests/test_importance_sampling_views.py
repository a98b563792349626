"""The importance-sampling figures where a user reads them: run's case table and --json, the
plugin's failure text and junit properties, the report's text, --json and HTML panel.

Real runs of the cpu-smoke runtime (the CLI in-process, the plugin through pytester); every
figure shown is checked against a float64 recomputation written here from the sealed
token_diffs.pt, independently of ``numerics.importance_sampling``.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import OFFSET_EXPECT, S0, cli

from pytest_logprob_drift.store.layout import COMPARISON, TOKEN_DIFFS
from pytest_logprob_drift.store.run import iter_attempt_dirs
from pytest_logprob_drift.tensorio import tensors_from_bytes

pytest_plugins = ["pytester"]

EXPERIMENT = "s0-cpu-smoke"
OFFSET = "logp.backend=smoke_only.logp_offset"
CONFIG = "cross_config_s0_cpu_smoke.json"
FIXTURE = Path(__file__).parent / "data" / "pre_issue20" / "runs" / "fixture-pre20-cpu-smoke"
SHORTS = (
    "tis_clip_frac_cap2",
    "tis_clip_frac_cap3",
    "tis_clip_frac_cap5",
    "icepop_drop_frac",
    "seq_mask_frac_0999_1001",
    "seq_mask_frac_0999_1002",
    "seq_mask_frac_05_2",
    "trl_seq_mask_frac",
    "nemo_seq_error_frac",
)


def by_hand(attempt: Path) -> dict[str, float]:
    """ESS, the verl cap-2 clipped-token fraction and the NeMo-RL [0.999, 1.002] masked-sequence
    fraction, in float64 from the attempt's token_diffs.pt."""
    diffs = tensors_from_bytes((attempt / TOKEN_DIFFS).read_bytes())
    active = diffs["active_mask"].tolist()
    r_rows = (
        diffs["training_logprobs"].to(torch.float64) - diffs["rollout_logprobs"].to(torch.float64)
    ).tolist()
    rows = [
        [x for x, a in zip(row, mask, strict=True) if a]
        for row, mask in zip(r_rows, active, strict=True)
    ]
    rows = [row for row in rows if row]
    r = [x for row in rows for x in row]
    w = [math.exp(x) for x in r]
    mean = sum(w) / len(w)
    geometric = [math.exp(sum(row) / len(row)) for row in rows]
    return {
        "ess": 1.0 / (sum((x / mean) ** 2 for x in w) / len(w)),
        "tis_cap2": sum(1 for x in w if x > 2.0) / len(w),
        "seq_mask": sum(1 for g in geometric if g < 0.999 or g > 1.002) / len(geometric),
    }


def attempts(run_dir: Path) -> dict[str, Path]:
    return {
        json.loads((a / COMPARISON).read_bytes())["label"]: a for a in iter_attempt_dirs(run_dir)
    }


@pytest.fixture(scope="module")
def table_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The S0 smoke experiment run once, table output (not --json)."""
    root = tmp_path_factory.mktemp("is-views")
    code, out, err = cli(
        "run",
        S0,
        "--runtime",
        "cpu-smoke",
        "--allow-smoke-operators",
        "--expect",
        OFFSET_EXPECT,
        "--artifacts",
        root,
    )
    assert code == 0, (out, err)
    return root / EXPERIMENT, out


def column(out: str, header: str) -> dict[str, str]:
    """``label -> cell`` of one column of the run's case table."""
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("case_id"))
    start = re.search(rf"(?<=  ){re.escape(header)}(?=  )", lines[head])
    assert start is not None, lines[head]
    label_at = lines[head].index("label")
    cells = {}
    for line in lines[head + 2 :]:
        if not line.strip() or line.startswith("engine constructions"):
            break
        cells[line[label_at:].split()[0]] = line[start.start() :].split()[0]
    return cells


def test_run_table_shows_each_case_ess(table_run: tuple[Path, str]) -> None:
    run_dir, out = table_run
    shown = column(out, "ESS")
    sealed = attempts(run_dir)
    assert sorted(shown) == sorted(sealed)
    for label, cell in shown.items():
        expected = by_hand(sealed[label])["ess"]
        # four significant digits of the float64 figure
        assert float(cell) == pytest.approx(expected, rel=5e-4), label
        assert cell == f"{float(cell):.4g}"


def test_run_json_carries_the_figures(tmp_path: Path) -> None:
    code, out, err = cli(
        "run",
        S0,
        "--runtime",
        "cpu-smoke",
        "--allow-smoke-operators",
        "--expect",
        OFFSET_EXPECT,
        "--artifacts",
        tmp_path,
        "--json",
    )
    assert code == 0, err
    results = {r["label"]: r for r in json.loads(out)["results"]}
    for label, attempt in attempts(tmp_path / EXPERIMENT).items():
        part = results[label]["importance_sampling"]
        hand = by_hand(attempt)
        assert part["ess"] == pytest.approx(hand["ess"], rel=1e-12, abs=1e-12)
        assert part["corrections"]["tis_clipped_token_fraction_cap_2"] == hand["tis_cap2"]
        sealed = json.loads((attempt / COMPARISON).read_bytes())
        assert part == sealed["diagnostics"]["importance_sampling"]


# ---- the plugin ---------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _torch_loaded_once() -> None:
    pytest.importorskip("torch")


def test_plugin_failure_text_and_junit_properties(pytester: pytest.Pytester) -> None:
    shutil.copy(S0, pytester.path / CONFIG)
    result = pytester.runpytest(
        "--drift-config",
        CONFIG,
        "--drift-runtime",
        "cpu-smoke",
        "--drift-allow-smoke-operators",
        "--junitxml",
        "out.xml",
    )
    result.assert_outcomes(passed=2, failed=1)
    root = ET.parse(pytester.path / "out.xml").getroot()
    props = {
        case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
        for case in root.iter("testcase")
    }
    for label, p in props.items():
        hand = by_hand(Path(str(p["drift_attempt"])))
        assert float(str(p["drift_is_ess"])) == pytest.approx(hand["ess"], rel=1e-12, abs=1e-12)
        assert float(str(p["drift_is_tis_clip_frac_cap2"])) == hand["tis_cap2"], label
        assert float(str(p["drift_is_seq_mask_frac_0999_1002"])) == hand["seq_mask"], label
        for short in SHORTS:
            assert 0.0 <= float(str(p[f"drift_is_{short}"])) <= 1.0, (label, short)
        whole = json.loads(str(p["drift_importance_sampling"]))
        assert whole["ess"] == float(str(p["drift_is_ess"]))
    # the smoke offset shifts every training token by 0.008: every sequence's geometric ratio
    # exp(-0.008) is outside [0.999, 1.002], and no weight exceeds 2
    offset = props[OFFSET]
    assert float(str(offset["drift_is_seq_mask_frac_0999_1002"])) == 1.0
    hand = by_hand(Path(str(offset["drift_attempt"])))
    # The failures section (pytest's short summary repeats the whole message where CI is set).
    shown = result.outlines[: next(i for i, x in enumerate(result.outlines) if "short test" in x)]
    text = "\n".join(shown)
    line = next(x for x in shown if "importance sampling over" in x)
    assert text.count("importance sampling over") == 1  # only the failing case's text
    ess = re.search(r"ESS (\S+) \(raw weights", line)
    clipped = re.search(r"verl TIS cap 2 clips (\S+)% of tokens", line)
    masked = re.search(r"NeMo-RL seq-mask-tis \[0\.999, 1\.002\] masks (\S+)% of sequences", line)
    assert ess and clipped and masked, line
    assert float(ess.group(1)) == pytest.approx(hand["ess"], rel=5e-4)
    assert float(clipped.group(1)) / 100 == pytest.approx(hand["tis_cap2"], abs=5e-3)
    assert float(masked.group(1)) == 100


# ---- the report ---------------------------------------------------------------------------


@pytest.mark.slow
def test_report_text_json_and_panel(table_run: tuple[Path, str], tmp_path: Path) -> None:
    run_dir, _ = table_run
    store = tmp_path / "runs"
    shutil.copytree(run_dir, store / EXPERIMENT)
    page = tmp_path / "page.html"
    code, out, err = cli("report", store / EXPERIMENT, "--html", page, "--json")
    assert code == 0, err
    cases = {c["label"]: c for c in json.loads(out)["cases"]}
    html = page.read_text()
    sealed = attempts(store / EXPERIMENT)
    for label, attempt in sealed.items():
        part = cases[label]["diagnostics"]["importance_sampling"]
        hand = by_hand(attempt)
        assert part["ess"] == pytest.approx(hand["ess"], rel=1e-12, abs=1e-12)
        assert (
            part["corrections"]["seq_mask_tis_masked_sequence_fraction_0999_1002"]
            == (hand["seq_mask"])
        )
    # one panel per detailed case, one row per peer correction, each carrying its fraction
    assert html.count("<h3>What your correction would do</h3>") == len(sealed)
    assert html.count("data-correction='tis_clipped_token_fraction_cap_2'") == len(sealed)
    assert html.count("data-correction=") == len(sealed) * len(SHORTS)
    # both columns are in the case table, behind its "more columns" toggle
    assert "<th class='more'>verl TIS cap 2 clipped</th>" in html
    assert "<th class='more'>ESS</th>" in html
    assert "<code>loss_fn.truncated_importance_sampling_type=seq-mask-tis, " in html
    assert "<code>grpo.seq_logprob_error_threshold</code>" in html

    # the text of the same report (the page exists: read, not drawn again); the corrections
    # per case are in the verbose report only
    code, out, err = cli("report", store / EXPERIMENT, "--html", page)
    assert code == 0, err
    assert not [x for x in out.splitlines() if x.startswith(f"{OFFSET}: ")]
    code, out, err = cli("report", store / EXPERIMENT, "--html", page, "--verbose")
    assert code == 0, err
    assert f"HTML report: {page} already exists; not overwritten" in out
    offset_lines = [x for x in out.splitlines() if x.startswith(f"{OFFSET}: ")]
    masked = "NeMo-RL seq-mask-tis [0.999, 1.002] masks 100% of sequences"
    assert any(masked in x for x in offset_lines), offset_lines
    # every peer correction is named with its flag in the text too
    assert any("grpo.seq_logprob_error_threshold <= 2" in x for x in offset_lines), offset_lines
    head = next(x for x in out.splitlines() if x.startswith("case_id"))
    assert head.split()[-6:] == ["ESS", "verl", "TIS", "cap", "2", "clipped"], head


@pytest.mark.slow
def test_report_computes_figures_for_old_attempts_at_read_time(tmp_path: Path) -> None:
    store = tmp_path / "runs"
    shutil.copytree(FIXTURE.parent, store)
    run_dir = store / FIXTURE.name
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    page = tmp_path / "page.html"
    code, out, err = cli("report", run_dir, "--html", page, "--json")
    assert code == 0, err
    cases = {c["label"]: c for c in json.loads(out)["cases"]}
    for label, attempt in attempts(run_dir).items():
        assert (
            "importance_sampling"
            not in json.loads((attempt / COMPARISON).read_bytes())["diagnostics"]
        )
        part: dict[str, Any] = cases[label]["diagnostics"]["importance_sampling"]
        assert part["ess"] == pytest.approx(by_hand(attempt)["ess"], rel=1e-12, abs=1e-12)
    assert page.read_text().count("<h3>What your correction would do</h3>") == len(cases)
    after = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    assert after == before  # computed, never written
