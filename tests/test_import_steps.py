"""Production runs, part 2 (issue 38): drift over training steps, and the worst samples of an
imported run turned into a prompt file ``init`` accepts.

On the shipped example dumps (``experiments/production``, made by
``scripts/make_example_dumps.py`` from a real hf run on the tiny Qwen3): every figure of the
steps view (``report --json`` and the text) equals a numpy float64 recomputation written here
from the sealed tensors (``token_diffs.pt`` read with ``torch.load(weights_only=True)``), the
first crossings and the trend sentence follow from them, and the findings lead with it; the
three formats give the same steps; ``--worst 4 --prompts-out`` writes the four samples this
test ranks from the dump's own numbers, with a version-2 ``source`` that ``init`` and planning
accept (and planning refuses when the checkpoint's tokenizer changed). Bad options are one line,
exit 2. The walk through ``run`` on hf and the page in Chromium are in
``tests/test_import_walk.py`` (slow).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from drift_testing import cli

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "experiments" / "production"
THRESHOLD = 1e-3
INPUTS = {
    "nemo-rl": EXAMPLE / "nemo-rl",
    "slime": EXAMPLE / "slime",
    "jsonl": EXAMPLE / "jsonl" / "drift.jsonl",
}


def _import(artifacts: Path, fmt: str, *extra: str | Path) -> tuple[int, dict[str, Any], str]:
    code, out, err = cli(
        "import", "--format", fmt, INPUTS[fmt], "--artifacts", artifacts,
        "--experiment-id", f"ex-{fmt}", "--json", *extra,
    )  # fmt: skip
    return code, (json.loads(out) if out.strip() else {}), err


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    artifacts = tmp_path_factory.mktemp("steps")
    code, result, err = _import(artifacts, "nemo-rl")
    assert code == 1, err
    run_dir = Path(result["run_dir"])
    code, out, err = cli("report", run_dir, "--json", "--no-html")
    assert code == 0, err
    return {"artifacts": artifacts, "result": result, "report": json.loads(out)}


def _sealed(attempt_dir: Path) -> dict[str, np.ndarray[Any, Any]]:
    tensors = torch.load(attempt_dir / "token_diffs.pt", weights_only=True)
    return {
        "training": tensors["training_logprobs"].to(torch.float64).numpy(),
        "rollout": tensors["rollout_logprobs"].to(torch.float64).numpy(),
        "active": tensors["active_mask"].numpy().astype(bool),
    }


def _figures(t: dict[str, np.ndarray[Any, Any]]) -> dict[str, float]:
    """The steps view's figures of one step, in numpy float64."""
    active = t["active"]
    r = (t["training"] - t["rollout"])[active]
    diff = np.abs(r)
    w = np.exp(r)
    rows = active.any(axis=1)
    sums = np.where(active, t["training"] - t["rollout"], 0.0).sum(axis=1)[rows]
    geometric = np.exp(sums / active.sum(axis=1)[rows])
    return {
        "mismatch_share": float((diff > THRESHOLD).sum() / diff.size),
        "max_abs_diff": float(diff.max()),
        "p99_abs_diff": float(np.quantile(diff, 0.99)),
        "ess": float(w.mean() ** 2 / (w**2).mean()),
        "tis_cap_2": float((w > 2.0).mean()),
        "icepop": float(((w < 0.5) | (w > 5.0)).mean()),
        "seq_mask_tis": float(((geometric < 0.999) | (geometric > 1.002)).mean()),
    }


def _worst(t: dict[str, np.ndarray[Any, Any]], step: int) -> list[tuple[int, float, int, int]]:
    """Every active row as (mismatches, max |diff|, step, row), worst first."""
    diff = np.abs(t["training"] - t["rollout"])
    out = []
    for row in range(diff.shape[0]):
        mask = t["active"][row]
        if mask.any():
            d = diff[row][mask]
            out.append((int((d > THRESHOLD).sum()), float(d.max()), step, row))
    return sorted(out, key=lambda x: (-x[0], -x[1], x[2], x[3]))


def test_the_steps_view_equals_a_numpy_recompute_from_the_sealed_tensors(
    imported: dict[str, Any],
) -> None:
    report = imported["report"]
    steps = report["steps"]
    by_step = {r["step"]: r for r in imported["result"]["results"]}
    assert [s["step"] for s in steps["steps"]] == [1, 2, 3, 4, 5, 6]
    recomputed: dict[int, dict[str, float]] = {}
    for row in steps["steps"]:
        tensors = _sealed(Path(by_step[row["step"]]["attempt_dir"]))
        want = _figures(tensors)
        recomputed[row["step"]] = want
        for key, value in want.items():
            assert math.isclose(row[key], value, rel_tol=1e-9, abs_tol=1e-15), (row["step"], key)
        worst = _worst(tensors, row["step"])[:3]
        got = [
            (w["mismatches"], w["max_abs_diff"], row["step"], w["row"])
            for w in row["worst_samples"]
        ]
        assert [(g[0], g[3]) for g in got] == [(w[0], w[3]) for w in worst]
        assert all(math.isclose(g[1], w[1], rel_tol=1e-12) for g, w in zip(got, worst, strict=True))
        assert all(
            w["source"].startswith(f"train_data_step{row['step']}.jsonl:")
            for w in row["worst_samples"]
        )
    # the first step each figure crossed the contract, from the recomputed figures
    lines = {
        "mismatch_share": ("above", 0.0),
        "max_abs_diff": ("above", THRESHOLD),
        "p99_abs_diff": ("above", THRESHOLD),
        "ess": ("below", 1.0 / math.cosh(THRESHOLD) ** 2),
        "tis_cap_2": ("above", 0.0),
        "icepop": ("above", 0.0),
        "seq_mask_tis": ("above", 0.0),
    }
    for figure in steps["figures"]:
        side, line = lines[figure["key"]]
        assert math.isclose(figure["line"], line, rel_tol=1e-12)
        first = next(
            (
                s
                for s in sorted(recomputed)
                if (
                    recomputed[s][figure["key"]] > line
                    if side == "above"
                    else recomputed[s][figure["key"]] < line
                )
            ),
            None,
        )
        assert figure["first_step"] == first, figure
    # drift rises over the example: the first MISMATCH is step 3, the share grows to step 6
    assert steps["first_mismatch"] == 3
    shares = [recomputed[s]["mismatch_share"] for s in sorted(recomputed)]
    assert shares[:2] == [0.0, 0.0] and shares[2] > 0 and shares[-1] == max(shares)
    trend = (
        f"The mismatch share rose from 0% at step 1 to {100 * shares[-1]:.3g}% at step 6; "
        f"first MISMATCH at step 3 ({sum(s > 0 for s in shares)} of 6 judged steps MISMATCH)."
    )
    assert steps["trend"] == trend
    assert report["findings"]["trend"] == trend


def test_the_text_report_leads_with_the_trend_and_carries_the_same_figures(
    imported: dict[str, Any],
) -> None:
    run_dir = Path(imported["result"]["run_dir"])
    code, out, err = cli("report", run_dir, "--no-html")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == imported["report"]["steps"]["trend"]
    table = lines[
        lines.index("drift over training steps (from each step's sealed comparison):") + 1 :
    ]
    for row in imported["report"]["steps"]["steps"]:
        line = next(x for x in table if x.split()[:2] == [str(row["step"]), row["outcome"]])
        assert f"{row['max_abs_diff']:.3e}" in line and f"{row['p99_abs_diff']:.3e}" in line
        share = row["mismatch_share"]
        assert ("0%" if share == 0 else f"{100 * share:.3g}%") in line
    crossed = next(x for x in lines if x.startswith("first crossed the contract: "))
    assert "mismatch share > 0: at step 3;" in crossed
    assert crossed.split("; never: ")[1].startswith("TIS cap 2 clipped share > 0")
    # one screen: the step table stands for the case table; the details are --verbose's
    assert not any(x.startswith("case_id ") for x in lines)
    assert len(lines) <= 40
    code, verbose, err = cli("report", run_dir, "--no-html", "--verbose")
    assert code == 0, err
    lines = verbose.splitlines()
    assert "  mismatch share > 0: at step 3" in lines
    assert "  TIS cap 2 clipped share > 0: never" in lines
    assert sum(x.startswith("case_id ") for x in lines) == 1


def test_the_three_formats_give_the_same_steps(tmp_path: Path, imported: dict[str, Any]) -> None:
    want = imported["report"]["steps"]
    for fmt in ("slime", "jsonl"):
        code, result, err = _import(tmp_path, fmt)
        assert code == 1, err
        code, out, err = cli("report", result["run_dir"], "--json", "--no-html")
        assert code == 0, err
        got = json.loads(out)["steps"]
        assert got["trend"] == want["trend"]
        for a, b in zip(got["steps"], want["steps"], strict=True):
            for key in ("step", "outcome", "mismatches", "mismatch_share", "max_abs_diff", "ess"):
                assert a[key] == b[key], (fmt, key)
            assert [w["row"] for w in a["worst_samples"]] == [w["row"] for w in b["worst_samples"]]


def _neutral_worst(k: int) -> list[dict[str, Any]]:
    """The k worst samples of the neutral dump, ranked here from its own numbers."""
    rows = [json.loads(line) for line in INPUTS["jsonl"].read_text().splitlines()]
    ranked = []
    for number, row in enumerate(rows, start=1):
        mask = np.asarray(row["mask"], dtype=bool)
        diff = np.abs(
            np.asarray(row["training_logprobs"], dtype=np.float64)
            - np.asarray(row["rollout_logprobs"], dtype=np.float64)
        )[mask]
        ranked.append(
            (-int((diff > THRESHOLD).sum()), -float(diff.max()), row["step"], number, row)
        )
    ranked.sort(key=lambda x: x[:4])
    return [r[4] for r in ranked[:k]]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    from pytest_logprob_drift.runtimes.tiny_model import build_tiny_checkpoint

    directory = tmp_path_factory.mktemp("ckpt") / "tiny-qwen3"
    build_tiny_checkpoint(directory)
    return directory


def test_worst_writes_the_most_drifting_prompts_and_init_plans_them(
    tmp_path: Path, checkpoint: Path
) -> None:
    prompts = tmp_path / "worst.json"
    code, result, err = _import(
        tmp_path, "jsonl", "--worst", "4", "--prompts-out", prompts, "--checkpoint", checkpoint
    )
    assert code == 1, err
    document = json.loads(prompts.read_text())
    want = _neutral_worst(4)
    assert document["token_ids"] == [r["token_ids"][: r["prompt_length"]] for r in want]
    source = document["source"]
    assert source["schema"] == "pytest_logprob_drift.prompt_source.v2"
    assert source["run"]["experiment_id"] == "ex-jsonl" and source["run"]["format"] == "jsonl"
    assert source["run"]["inputs"] == [
        {k: i[k] for k in ("path", "sha256", "size")} for i in result["inputs"]
    ]
    assert [(p["step"], p["sample"]) for p in source["prompts"]] == [
        (r["step"], r["sample"]) for r in want
    ]
    case_of = {r["step"]: r["case_id"] for r in result["results"]}
    assert all(p["case_id"] == case_of[p["step"]] for p in source["prompts"])
    assert set(source["tokenizer_files"]) == {"tokenizer.json", "tokenizer_config.json"}
    assert result["prompts_out"]["token_ids"] == document["token_ids"]
    # init accepts the file, and planning checks the tokenizer digests
    config = tmp_path / "experiment.json"
    code, _, err = cli(
        "init", "--checkpoint", checkpoint, "--prompts", prompts, "--runtime", "hf",
        "--output", config,
    )  # fmt: skip
    assert code == 0, err
    assert cli("plan", config)[0] == 0
    changed = tmp_path / "changed"
    changed.mkdir()
    for f in checkpoint.iterdir():
        (changed / f.name).write_bytes(f.read_bytes())
    (changed / "tokenizer_config.json").write_text(
        (checkpoint / "tokenizer_config.json").read_text().replace("}", ', "x": 1}', 1)
    )
    moved = json.loads(config.read_text())
    moved["identity"]["checkpoint"]["uri"] = str(changed)
    config.write_text(json.dumps(moved))
    code, _, err = cli("plan", config)
    assert code == 2
    assert "tokenizer_config.json" in err and "import the run again with --checkpoint" in err


def test_worst_without_checkpoint_records_no_tokenizer(tmp_path: Path) -> None:
    prompts = tmp_path / "worst.json"
    code, _, err = _import(tmp_path, "slime", "--worst", "2", "--prompts-out", prompts)
    assert code == 1, err
    source = json.loads(prompts.read_text())["source"]
    assert source["tokenizer_files"] is None
    assert [(p["step"], p["index"], p["line"]) for p in source["prompts"]] == [
        (3, 0, None),
        (5, 0, None),
    ]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--worst", "2"], "--worst K and --prompts-out FILE go together"),
        (["--prompts-out", "{tmp}/p.json"], "--worst K and --prompts-out FILE go together"),
        (["--worst", "0", "--prompts-out", "{tmp}/p.json"], "--worst must be a positive integer"),
        (["--worst", "2", "--prompts-out", "{tmp}/exists.json"], "already exists"),
        (["--worst", "2", "--prompts-out", "{tmp}/no/p.json"], "its directory does not exist"),
        (["--checkpoint", "{tmp}"], "--checkpoint DIR goes with --worst"),
        (
            ["--worst", "2", "--prompts-out", "{tmp}/p.json", "--checkpoint", "{tmp}/none"],
            "not a directory",
        ),
        (
            ["--worst", "2", "--prompts-out", "{tmp}/p.json", "--checkpoint", "{tmp}"],
            "no tokenizer file",
        ),
    ],
)
def test_bad_worst_options_are_one_line_and_publish_nothing(
    tmp_path: Path, extra: list[str], needle: str
) -> None:
    (tmp_path / "exists.json").write_text("{}")
    artifacts = tmp_path / "runs"
    args = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    code, out, err = cli(
        "import", "--format", "jsonl", INPUTS["jsonl"], "--artifacts", artifacts, *args
    )
    assert code == 2, (out, err)
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not artifacts.exists() or not list(artifacts.iterdir())
    assert not (tmp_path / "p.json").exists()


def test_a_version_2_source_is_read_strictly() -> None:
    from pytest_logprob_drift.config.prompt_source import (
        WORST_RANKING,
        SourceShapeError,
        parse_source,
    )

    inputs = [{"path": "a", "sha256": "0" * 64, "size": 3}]
    run = {"experiment_id": "r", "format": "nemo-rl", "inputs": inputs}

    good = {
        "schema": "pytest_logprob_drift.prompt_source.v2",
        "run": run,
        "ranking": WORST_RANKING,
        "threshold": 0.001,
        "tokenizer_files": None,
        "prompts": [
            {"step": 3, "case_id": "0123456789abcdef", "row": 0, "sample": 0, "input": 0,
             "line": 1, "index": None, "active": 12, "mismatches": 12, "max_abs_diff": 0.1},
        ],
    }  # fmt: skip
    parsed = parse_source(good, 1)
    assert parsed.prompts[0].step == 3 and parsed.tokenizer_files is None
    assert parsed.to_json() == good  # type: ignore[union-attr]
    faults = [
        ({"extra": 1}, "source.extra"),
        ({"run": {**run, "format": "verl"}}, "source.run.format"),
        ({"prompts": []}, "source.prompts"),
        ({"prompts": [{**good["prompts"][0], "input": 1}]}, "source.prompts[0].input"),
        ({"prompts": [{**good["prompts"][0], "mismatches": 13}]}, "source.prompts[0].mismatches"),
        ({"prompts": [{**good["prompts"][0], "case_id": "x"}]}, "source.prompts[0].case_id"),
        ({"tokenizer_files": {"tokenizer.json": "bad"}}, "source.tokenizer_files.tokenizer.json"),
        ({"ranking": "other"}, "source.ranking"),
    ]
    for change, path in faults:
        with pytest.raises(SourceShapeError) as caught:
            parse_source({**good, **change}, 1)
        assert caught.value.path == path, change
