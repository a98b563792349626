"""``logprob-drift import`` (issue 37): a production run's logged logprobs judged per step by
the contract's one rule, sealed, re-checked by ``verify`` and rendered by ``report``.

The dumps are written by hand as NeMo-RL, slime and the neutral format write them
(``production_dumps``, which names the upstream files read); every step's verdict, mismatch
count and ESS are checked against numpy float64 recomputations of the written numbers. Every
bad input of the issue is refused in one line naming the file and the line or sample, exit 2,
with nothing published.
"""

from __future__ import annotations

import json
import math
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from drift_testing import cli
from production_dumps import (
    Expected,
    Sample,
    expected,
    log_batched_dict_as_jsonl,
    make_samples,
    nemo_rl_log_data,
    neutral_rows,
    write_jsonl,
    write_nemo_rl_step,
    write_slime_dump,
)


def _import(fmt: str, artifacts: Path, *paths: Path | str, json_out: bool = True) -> Any:
    args = ["import", "--format", fmt, *map(str, paths), "--artifacts", str(artifacts)]
    code, out, err = cli(*args, *(["--json"] if json_out else []))
    return code, (json.loads(out) if json_out and out.strip() else out), err


def _check_step(result: dict[str, Any], want: Expected) -> None:
    assert result["outcome"] == want.outcome, result["reason"]
    assert result["mismatches"] == want.mismatches
    assert result["active_tokens"] == want.active
    if want.outcome == "INVALID_ARTIFACT":
        nonfinite = want.extra["nonfinite_tokens"]
        assert f"({nonfinite} of {want.active} active tokens non-finite)" in result["reason"]
    if want.outcome in ("PASS", "MISMATCH"):
        assert math.isclose(result["importance_sampling"]["ess"], want.ess, rel_tol=1e-9)
        assert math.isclose(result["max_abs_diff"], want.extra["max_abs_diff"], rel_tol=1e-12)
    else:
        assert "importance_sampling" not in result


def _published(artifacts: Path) -> list[str]:
    """What the artifacts directory holds (a refused import leaves nothing, not even its
    staging directory)."""
    return sorted(os.listdir(artifacts)) if artifacts.exists() else []


def _verify(run_dir: Path) -> tuple[int, dict[str, Any]]:
    code, out, _ = cli("verify", run_dir, "--json")
    return code, json.loads(out)


# --------------------------------------------------------------------------- the formats


def test_nemo_rl_and_slime_dumps_are_judged_per_step_as_numpy_recomputes(tmp_path: Path) -> None:
    rng = np.random.default_rng(37)
    nemo = tmp_path / "nemo-logs"
    nemo.mkdir()
    steps: dict[int, list[Sample]] = {
        2: make_samples(rng, 5),
        10: make_samples(rng, 6, planted=[(1, 2, 0.02), (3, 0, -0.5), (4, 1, 0.0011)]),
        3: make_samples(rng, 4),
        7: make_samples(rng, 3),
    }
    # a sample the trainer masks out (sample_loss_mask 0) drifts a lot: never judged
    steps[2][4].training = [v + 1.0 for v in steps[2][4].training]
    steps[2][4].counts = False
    # NaN at an inactive position (the end-of-turn token) is ignored
    steps[2][0].training[-1] = float("nan")
    # NaN and infinity at active positions: that step alone is INVALID_ARTIFACT
    steps[3][1].training[0] = float("nan")
    steps[3][2].rollout[1] = float("-inf")
    # every sample masked out: nothing to compare
    for s in steps[7]:
        s.counts = False
    for step, samples in steps.items():
        write_nemo_rl_step(nemo, step, samples)
    code, document, err = _import("nemo-rl", tmp_path / "runs", nemo)
    assert code == 1, err
    results = document["results"]
    assert [r["label"] for r in results] == ["step=2", "step=3", "step=7", "step=10"]
    for result in results:
        _check_step(result, expected(steps[result["step"]]))
    assert [r["outcome"] for r in results] == [
        "PASS",
        "INVALID_ARTIFACT",
        "ZERO_ACTIVE_TOKENS",
        "MISMATCH",
    ]
    assert results[3]["mismatches"] == 3  # 0.02, 0.5 and 0.0011 > 1e-3
    run_dir = Path(document["run_dir"])
    plan = [json.loads(line) for line in (run_dir / "plan.jsonl").read_text().splitlines()]
    assert [row["label"] for row in plan] == ["step=2", "step=3", "step=7", "step=10"]
    experiment = json.loads((run_dir / "experiment.json").read_text())
    imported = experiment["imported"]
    assert imported["format"] == "nemo-rl"
    assert {i["path"] for i in imported["inputs"]} == {
        str(nemo / f"train_data_step{n}.jsonl") for n in steps
    }
    for entry in imported["inputs"]:
        data = Path(entry["path"]).read_bytes()
        assert entry["size"] == len(data)
        assert entry["sha256"] == __import__("hashlib").sha256(data).hexdigest()
    assert "prev_logprobs" in imported["fields"] and "generation_logprobs" in imported["fields"]
    step10 = json.loads((Path(results[3]["attempt_dir"]) / "imported.json").read_text())
    assert step10["samples"] == 6
    assert [r["line"] for r in step10["rows"]] == [1, 2, 3, 4, 5, 6]
    assert [r["sample"] for r in step10["rows"]] == [0, 1, 2, 3, 4, 5]
    assert step10["logprob_dtype"] == "float32"
    assert step10["rollout_logprobs"] == "generation_logprobs"
    assert step10["training_logprobs"] == "prev_logprobs"
    # the step's own document set: imported.json (v3, with the importing environment) beside
    # comparison.json and the tensors; nothing requested, materialized, read back or identified
    attempt_dir = Path(results[3]["attempt_dir"])
    assert step10["schema_version"] == "cross_config.imported_step.v3"
    assert set(step10["environment"]) == {"python", "torch", "pytest_logprob_drift"}
    assert sorted(p.name for p in attempt_dir.iterdir()) == [
        "COMPLETE",
        "comparison.json",
        "imported.json",
        "score_rollout.pt",
        "score_training.pt",
        "token_diffs.pt",
    ]

    code, verified = _verify(run_dir)
    assert code == 0, verified
    assert {a["outcome"] for a in verified["attempts"]} == {
        "PASS",
        "MISMATCH",
        "INVALID_ARTIFACT",
        "ZERO_ACTIVE_TOKENS",
    }

    # slime: a --dump-details directory, two DP shards per dump
    slime = tmp_path / "slime-dump"
    rollouts: dict[int, list[Sample]] = {
        0: make_samples(rng, 4, prompt=6),
        1: make_samples(rng, 5, prompt=3, planted=[(0, 0, 0.003), (2, 3, -0.004)]),
    }
    for rollout_id, samples in rollouts.items():
        write_slime_dump(slime, rollout_id, samples)
    code, document, err = _import("slime", tmp_path / "runs", slime)
    assert code == 1, err
    results = document["results"]
    assert [r["step"] for r in results] == [0, 1]
    for result in results:
        _check_step(result, expected(rollouts[result["step"]]))
    assert [r["outcome"] for r in results] == ["PASS", "MISMATCH"]
    rows = json.loads((Path(results[1]["attempt_dir"]) / "imported.json").read_text())["rows"]
    assert [(r["index"], r["sample"], r.get("line")) for r in rows] == [
        (i, i, None) for i in range(5)
    ]
    code, verified = _verify(Path(document["run_dir"]))
    assert code == 0, verified


@pytest.mark.slow
def test_the_neutral_format_and_what_verify_and_report_make_of_an_import(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    steps = {0: make_samples(rng, 3), 1: make_samples(rng, 4, planted=[(2, 1, 0.25)])}
    path = write_jsonl(
        tmp_path / "rollouts.jsonl", neutral_rows(0, steps[0]) + neutral_rows(1, steps[1])
    )
    artifacts = tmp_path / "runs"
    code, document, err = _import("jsonl", artifacts, path)
    assert code == 1, err
    for result in document["results"]:
        _check_step(result, expected(steps[result["step"]]))
    run_dir = Path(document["run_dir"])
    assert document["experiment_id"].startswith("import-jsonl-")

    # the same input again: the run exists and is never written into
    code, _, err = _import("jsonl", artifacts, path)
    assert code == 2
    assert "exists" in err and err.count("\n") == 1

    # the terminal table, and the exit code of an all-PASS import
    code, out, err = _import(
        "jsonl",
        tmp_path / "pass",
        write_jsonl(tmp_path / "pass.jsonl", neutral_rows(4, steps[0])),
        json_out=False,
    )
    assert code == 0, err
    assert "step=4" in out and "PASS" in out

    code, out, err = cli("report", run_dir)
    assert code == 0, err
    page = next(run_dir.glob("report-*.html")).read_text()
    assert "step=1" in page and "MISMATCH" in page

    code, verified = _verify(run_dir)
    assert code == 0
    # a tampered imported file is invalid: one logprob changed in token_diffs.pt
    attempt = Path(document["results"][1]["attempt_dir"])
    tensors = torch.load(attempt / "token_diffs.pt", weights_only=True)
    tensors["training_logprobs"][0, 5] += 1.0
    target = attempt / "token_diffs.pt"
    target.chmod(0o644)
    torch.save(tensors, target)
    code, verified = _verify(run_dir)
    assert code == 1
    bad = [a for a in verified["attempts"] if a["status"] == "invalid"]
    assert [a["file"] for a in bad] == ["token_diffs.pt"]
    # ...and so is a changed imported.json
    other = Path(document["results"][0]["attempt_dir"]) / "imported.json"
    other.chmod(0o644)
    other.write_text(other.read_text().replace('"samples": 3', '"samples": 2'))
    code, verified = _verify(run_dir)
    assert {a["file"] for a in verified["attempts"] if a["status"] == "invalid"} == {
        "token_diffs.pt",
        "imported.json",
    }


def test_steps_order_by_their_number_and_an_experiment_id_is_taken(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    logs = tmp_path / "logs"
    logs.mkdir()
    files = [write_nemo_rl_step(logs, n, make_samples(rng, 2)) for n in (10, 2, 1)]
    code, document, err = cli(
        "import",
        "--format",
        "nemo-rl",
        files[0],
        files[1],
        files[2],
        "--artifacts",
        tmp_path / "runs",
        "--experiment-id",
        "prod-7",
        "--json",
    )
    assert code == 0, err
    result = json.loads(document)
    assert result["run_dir"] == str(tmp_path / "runs" / "prod-7")
    assert [r["step"] for r in result["results"]] == [1, 2, 10]


# --------------------------------------------------------------------------- bad input


def _refused(tmp_path: Path, fmt: str, *paths: Path, match: str) -> str:
    artifacts = tmp_path / "runs"
    code, out, err = _import(fmt, artifacts, *paths)
    assert code == 2, (out, err)
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    assert match in err, err
    assert _published(artifacts) == [], "nothing may be published on bad input"
    return err


def _nemo_lines(samples: list[Sample]) -> list[dict[str, Any]]:
    path = Path(os.devnull)
    del path
    data = nemo_rl_log_data(samples)
    size = len(data["token_ids"])
    return [{**{k: v[i : i + 1] for k, v in data.items()}, "idx": i} for i in range(size)]


def _write_lines(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture
def samples() -> list[Sample]:
    return make_samples(np.random.default_rng(9), 3)


def test_a_logprob_array_of_another_length_than_its_tokens_or_mask(
    tmp_path: Path, samples: list[Sample]
) -> None:
    lines = _nemo_lines(samples)
    lines[1]["generation_logprobs"][0].pop()
    path = _write_lines(tmp_path / "train_data_step4.jsonl", lines)
    err = _refused(tmp_path, "nemo-rl", path, match="generation_logprobs has")
    assert f"{path}:2:" in err

    rows = neutral_rows(0, samples)
    rows[2]["training_logprobs"] = rows[2]["training_logprobs"][:-1]
    path = write_jsonl(tmp_path / "n.jsonl", rows)
    err = _refused(tmp_path, "jsonl", path, match="training_logprobs has")
    assert f"{path}:3:" in err

    shorter = make_samples(np.random.default_rng(2), 2)
    shorter[1].training = shorter[1].training[:-2]
    dump = write_slime_dump(tmp_path / "s", 3, shorter)
    err = _refused(tmp_path, "slime", dump, match="log_probs has")
    assert f"{dump}: sample 1:" in err


def test_a_mask_that_is_not_0_or_1(tmp_path: Path, samples: list[Sample]) -> None:
    lines = _nemo_lines(samples)
    lines[0]["token_loss_mask"][0][6] = 2
    path = _write_lines(tmp_path / "train_data_step1.jsonl", lines)
    err = _refused(tmp_path, "nemo-rl", path, match="token_loss_mask holds 2.0 at position 6")
    assert f"{path}:1:" in err

    bad = make_samples(np.random.default_rng(3), 2)
    payload_path = write_slime_dump(tmp_path / "s", 0, bad)
    payload = torch.load(payload_path, weights_only=True)
    payload["samples"][0]["loss_masks"] = payload["samples"][0]["loss_masks"].float() * 0.5
    torch.save(payload, payload_path)
    _refused(tmp_path, "slime", payload_path, match="sample 0: loss_masks holds 0.5")


def test_a_response_longer_than_its_sequence(tmp_path: Path, samples: list[Sample]) -> None:
    rows = neutral_rows(0, samples)
    rows[1]["prompt_length"] += 3
    path = write_jsonl(tmp_path / "n.jsonl", rows)
    _refused(tmp_path, "jsonl", path, match="is longer than its sequence")

    dump = write_slime_dump(tmp_path / "s", 0, samples)
    payload = torch.load(dump, weights_only=True)
    payload["samples"][2]["response_lengths"] = payload["samples"][2]["total_lengths"] + 1
    torch.save(payload, dump)
    _refused(tmp_path, "slime", dump, match="sample 2: response_lengths")

    lines = _nemo_lines(samples)
    lines[2]["input_lengths"] = [len(lines[2]["token_ids"][0]) + 1]
    path = _write_lines(tmp_path / "train_data_step1.jsonl", lines)
    _refused(tmp_path, "nemo-rl", path, match="is longer than its sequence")


def test_an_empty_file(tmp_path: Path) -> None:
    for fmt, name in (
        ("nemo-rl", "train_data_step1.jsonl"),
        ("slime", "1.pt"),
        ("jsonl", "x.jsonl"),
    ):
        path = tmp_path / name
        path.write_bytes(b"")
        _refused(tmp_path, fmt, path, match="empty file")
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    _refused(tmp_path, "jsonl", blank, match="holds no rows")


def test_a_format_that_does_not_match_the_flag(tmp_path: Path, samples: list[Sample]) -> None:
    neutral = write_jsonl(tmp_path / "train_data_step1.jsonl", neutral_rows(1, samples))
    _refused(tmp_path, "nemo-rl", neutral, match="--format jsonl")
    nemo = write_nemo_rl_step(tmp_path, 2, samples)
    _refused(tmp_path, "jsonl", nemo, match="--format nemo-rl")
    _refused(tmp_path, "slime", nemo, match="not a torch.save file")
    dump = write_slime_dump(tmp_path / "s", 0, samples)
    renamed = tmp_path / "train_data_step0.jsonl"
    renamed.write_bytes(dump.read_bytes())
    _refused(tmp_path, "nemo-rl", renamed, match="--format slime")
    not_a_dump = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(3)}, not_a_dump)
    _refused(tmp_path, "slime", not_a_dump, match="not a slime train dump")


def test_a_file_over_the_size_limit(tmp_path: Path) -> None:
    big = tmp_path / "train_data_step1.jsonl"
    with open(big, "wb") as f:  # sparse: nothing is written to disk
        f.truncate(2 * 2**30 + 1)
    _refused(tmp_path, "nemo-rl", big, match="larger than the import limit of 2 GiB")


class _Opaque:
    """What a rollout dump holds that a weights-only load refuses (slime's Sample objects)."""

    def __init__(self) -> None:
        self.value = 1


def test_a_pickle_is_never_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    payload = pickle.dumps({"batch": [1, 2, 3]})
    for fmt, name in (("jsonl", "data_proto.pkl"), ("jsonl", "rows.jsonl"), ("slime", "7.pt")):
        path = tmp_path / name
        path.write_bytes(payload)
        err = _refused(tmp_path, fmt, path, match="a Python pickle")
        assert "docs/PRODUCTION_RUNS.md" in err
    legacy = tmp_path / "legacy.pt"
    torch.save({"samples": []}, legacy, _use_new_zipfile_serialization=False)
    _refused(tmp_path, "slime", legacy, match="a Python pickle")
    rollout_dump = tmp_path / "rollout_data" / "3.pt"
    rollout_dump.parent.mkdir()
    torch.save({"samples": [_Opaque()]}, rollout_dump)
    _refused(tmp_path, "slime", rollout_dump, match="weights_only=True")
    assert not marker.exists()


def test_an_older_nemo_rl_file_without_token_fields(tmp_path: Path, samples: list[Sample]) -> None:
    lines = _nemo_lines(samples)
    for line in lines:
        for name in ("token_ids", "token_loss_mask", "sample_loss_mask"):
            del line[name]
    path = _write_lines(tmp_path / "train_data_step3.jsonl", lines)
    err = _refused(
        tmp_path, "nemo-rl", path, match="no token_ids, token_loss_mask, sample_loss_mask"
    )
    assert "older NeMo-RL" in err


def test_bad_input_after_good_steps_publishes_nothing(
    tmp_path: Path, samples: list[Sample]
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    write_nemo_rl_step(logs, 1, samples)
    lines = _nemo_lines(samples)
    lines[1]["prev_logprobs"][0].append(0.0)
    _write_lines(logs / "train_data_step2.jsonl", lines)
    err = _refused(tmp_path, "nemo-rl", logs, match="prev_logprobs has")
    assert "train_data_step2.jsonl:2:" in err


def test_a_neutral_step_written_in_two_places_is_refused(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    a, b = make_samples(rng, 2), make_samples(rng, 2)
    rows = neutral_rows(0, a[:1]) + neutral_rows(1, b) + neutral_rows(0, a[1:])
    path = write_jsonl(tmp_path / "n.jsonl", rows)
    _refused(tmp_path, "jsonl", path, match="write each step's samples together")


def test_parquet_without_the_extra_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        path = tmp_path / "rows.parquet"
        path.write_bytes(b"PAR1" + b"\0" * 16 + b"PAR1")
        _refused(tmp_path, "jsonl", path, match="install the 'parquet' extra")
    else:  # pragma: no cover - the extra is installed
        pytest.skip("pyarrow is installed")


def test_parquet_rows_are_judged_like_the_same_jsonl_rows(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rng = np.random.default_rng(8)
    steps = {3: make_samples(rng, 3), 4: make_samples(rng, 2, planted=[(1, 0, 0.01)])}
    rows = neutral_rows(3, steps[3]) + neutral_rows(4, steps[4])
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    code, document, err = _import("jsonl", tmp_path / "runs", path)
    assert code == 1, err
    for result in document["results"]:
        _check_step(result, expected(steps[result["step"]]))
    code, _ = _verify(Path(document["run_dir"]))
    assert code == 0
    rows[1]["mask"] = [2] * len(rows[1]["mask"])
    pq.write_table(pa.Table.from_pylist(rows), path)
    err = _refused(tmp_path / "bad", "jsonl", path, match="mask holds 2.0 at position 0")
    assert f"{path}:2:" in err


def test_the_nemo_rl_logger_round_trip_writes_what_the_importer_reads(tmp_path: Path) -> None:
    """The hand-written logger writes NaN as NeMo-RL's json.dumps does: a bare word."""
    samples = make_samples(np.random.default_rng(0), 1)
    samples[0].training[-1] = float("nan")
    path = tmp_path / "train_data_step1.jsonl"
    log_batched_dict_as_jsonl(nemo_rl_log_data(samples), path)
    assert "NaN" in path.read_text()
    code, document, err = _import("nemo-rl", tmp_path / "runs", path)
    assert code == 0, err
    _check_step(document["results"][0], expected(samples))
