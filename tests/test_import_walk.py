"""The walk of docs/PRODUCTION_RUNS.md, "my NeMo-RL run drifts" to "this knob causes it", on the
shipped example dumps (issue 38), and the imported run's page in headless Chromium. Slow: a
real hf run, and a browser.

``import`` of the NeMo-RL example with ``--worst 4 --prompts-out --checkpoint`` (the steps
plot's data equal to a numpy recompute from the sealed tensors), ``init`` on the prompt file,
``run`` on hf (its interventions cut to the rollout dtype and the training dtype), and the
run's prompts, read back from its sealed tensors, equal to the imported samples' prompts read
from the imported run's sealed tensors. The page: the steps plot drawn, the trend sentence
first in the findings, every worst sample one click from its line in the token view.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import cli
from report_browser import live_page, open_page
from test_import_steps import INPUTS, _figures, _sealed

pytestmark = pytest.mark.slow


def _prompts_of(attempt_dir: Path) -> list[list[int]]:
    """Each row's prompt (its token ids before the response starts) from a sealed attempt."""
    tensors = torch.load(attempt_dir / "score_rollout.pt", weights_only=True)
    ids, starts = tensors["token_ids"], tensors["prompt_lengths"]
    return [ids[i, : int(starts[i])].tolist() for i in range(int(ids.shape[0]))]


def test_the_walk_from_a_drifting_nemo_rl_run_to_the_knob(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from pytest_logprob_drift.runtimes.tiny_model import build_tiny_checkpoint

    checkpoint = tmp_path / "tiny-qwen3"
    build_tiny_checkpoint(checkpoint)
    artifacts = tmp_path / "runs"
    prompts = tmp_path / "worst.json"
    # 1. import the production run, the 4 samples with the most drift as prompts
    code, out, err = cli(
        "import", "--format", "nemo-rl", INPUTS["nemo-rl"], "--artifacts", artifacts,
        "--experiment-id", "production", "--worst", "4", "--prompts-out", prompts,
        "--checkpoint", checkpoint, "--json",
    )  # fmt: skip
    assert code == 1, err
    imported = json.loads(out)
    by_case = {r["case_id"]: r for r in imported["results"]}
    # the steps plot's data, recomputed from the sealed tensors
    code, out, err = cli("report", imported["run_dir"], "--json", "--no-html")
    assert code == 0, err
    for row in json.loads(out)["steps"]["steps"]:
        want = _figures(_sealed(Path(by_case[row["case_id"]]["attempt_dir"])))
        assert all(math.isclose(row[k], v, rel_tol=1e-9, abs_tol=1e-15) for k, v in want.items())
    # 2. init on the prompt file
    config = tmp_path / "experiment.json"
    code, out, err = cli(
        "init", "--checkpoint", checkpoint, "--prompts", prompts, "--runtime", "hf",
        "--output", config,
    )  # fmt: skip
    assert code == 0, err
    document = json.loads(config.read_text())
    document["interventions"] = [
        i
        for i in document["interventions"]
        if i["path"] in ("rollout.dtype", "training.compute_dtype")
    ]
    config.write_text(json.dumps(document, indent=2))
    # 3. run on hf with what init says the starter expects: exit 0
    expect = out.split(" --runtime hf ", 1)[1].split("\n", 1)[0].split()
    assert expect == [
        "--expect", "rollout.dtype=bfloat16=MISMATCH",
        "--expect", "training.compute_dtype=bfloat16=MISMATCH",
    ]  # fmt: skip
    code, out, err = cli(
        "run", config, "--runtime", "hf", "--artifacts", artifacts, "--json", *expect
    )
    assert code == 0, err
    results = {r["label"]: r for r in json.loads(out)["results"]}
    assert results["baseline"]["outcome"] == "PASS"
    assert results["rollout.dtype=bfloat16"]["outcome"] == "MISMATCH"
    assert cli("verify", artifacts / document["experiment_id"])[0] == 0
    # 4. the run's prompts are the imported samples' prompts, as the imported run sealed them
    source = json.loads(prompts.read_text())["source"]
    want = [
        _prompts_of(Path(by_case[p["case_id"]]["attempt_dir"]))[p["row"]] for p in source["prompts"]
    ]
    for label in ("baseline", "rollout.dtype=bfloat16"):
        assert _prompts_of(Path(results[label]["attempt_dir"])) == want


def test_the_imported_run_page_in_chromium(tmp_path: Path) -> None:
    artifacts = tmp_path / "runs"
    code, out, err = cli(
        "import", "--format", "nemo-rl", INPUTS["nemo-rl"], "--artifacts", artifacts,
        "--experiment-id", "production", "--json",
    )  # fmt: skip
    assert code == 1, err
    run_dir = Path(json.loads(out)["run_dir"])
    page = tmp_path / "production.html"
    code, out, err = cli("report", run_dir, "--json", "--html", page)
    assert code == 0, err
    report = json.loads(out)
    trend = report["steps"]["trend"]
    check = open_page(page, "report-imported-steps.png")
    assert not check.console_errors and not check.external_requests(page)
    steps_plot = next(p for p in check.plots if p["plot"] == "steps")
    assert steps_plot["svg"] and steps_plot["drawn"] > 20 and steps_plot["variance"] > 100
    worst = [
        (row["case_id"], w["row"]) for row in report["steps"]["steps"] for w in row["worst_samples"]
    ]
    assert len(worst) == 18
    with live_page(page, width=1280, height=800) as live:
        first: Any = live.evaluate(
            "(() => { const f = document.querySelector('#findings');"
            " const p = f.querySelector('p'); return [p.className, p.textContent]; })()"
        )
        assert first == ["trend", trend]
        links = live.evaluate(
            "[...document.querySelectorAll('#steps a.worst-sample')].map(a => a.hash)"
        )
        assert links == [f"#tokens-{case}-{row}" for case, row in worst]
        for i, (case, row) in enumerate(worst):
            live.evaluate(f"document.querySelectorAll('#steps a.worst-sample')[{i}].click()")
            target = f"document.getElementById('tokens-{case}-{row}')"
            live.wait_until(f"location.hash === '#tokens-{case}-{row}'")
            line = f"{target}.querySelector('.line')"
            drawn = live.wait_until(f"{line}.querySelectorAll('.tk').length")
            assert drawn > 0
            where = live.evaluate(
                f"(() => {{ const b = {target}.getBoundingClientRect();"
                f" return [b.top, {target}.closest('div.tokens').dataset.case,"
                f" {line}.dataset.sample]; }})()"
            )
            assert -1 < where[0] < 800 and where[1] == case and where[2] == str(row)
        assert not live.console_errors()
