"""The drift signatures sealed in each step's comparison.json, checked by verify, computed at
read time for runs sealed before them, and shown by the report (findings, text, page, JSON).

The shipped example dumps (``scripts/make_example_dumps.py``: six steps of four samples, a
rising share of them from a bfloat16 rollout) name exactly ``step_trend`` and the
``sample_outliers`` of the mixed steps; which samples those are is computed here from the dump
itself (each sample's mean |diff| in float64). Honest bf16 runs name nothing: the sealed hf and
vllm-hf runs of the previous release (``tests/data/wave4``), and a bf16 decode-with-cache
against a teacher-forced forward of the tiny Qwen3 with masked 0.0 tool spans, written here as
the neutral format and imported.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from drift_testing import cli, copy_of_s0

from pytest_logprob_drift.store.files import json_bytes
from pytest_logprob_drift.store.layout import COMPARISON, COMPLETE
from pytest_logprob_drift.store.run import iter_attempt_dirs

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "experiments" / "production" / "jsonl" / "drift.jsonl"
WAVE4 = Path(__file__).parent / "data" / "wave4" / "runs"
BF16_LEVEL = 1e-3
"""A sample's mean |diff| above it comes from the bfloat16 rollout (float32 ones are ~1e-6)."""


def _import(artifacts: Path, source: Path, experiment_id: str) -> Path:
    code, out, err = cli(
        "import", "--format", "jsonl", source, "--artifacts", artifacts,
        "--experiment-id", experiment_id, "--json",
    )  # fmt: skip
    assert code in (0, 1), err
    return Path(json.loads(out)["run_dir"])


def _report(run_dir: Path, page: Path | None = None) -> tuple[dict[str, Any], str]:
    """The JSON and text reports; the page too where the test reads it (drawing its plots is
    most of a report's time)."""
    drawn = ("--html", page) if page is not None else ("--no-html",)
    code, out, err = cli("report", run_dir, "--json", *drawn)
    assert (code, err) == (0, ""), out
    code, text, err = cli("report", run_dir, "--no-html")
    assert (code, err) == (0, ""), text
    return json.loads(out), text


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    artifacts = tmp_path_factory.mktemp("signatures")
    run_dir = _import(artifacts, EXAMPLE, "ex-signatures")
    report, text = _report(run_dir)
    return {"run_dir": run_dir, "report": report, "text": text}


def _expected_example() -> list[tuple[str, int | None, int | None]]:
    """From the dump alone: the samples of a bfloat16 rollout (mean |diff| above
    ``BF16_LEVEL``) in the steps that mix both kinds, and a trend since the steps' mean |diff|
    rises with the share of those samples."""
    by_step: dict[int, list[tuple[int, float]]] = {}
    for line in EXAMPLE.read_text().splitlines():
        row = json.loads(line)
        mask = np.array(row["mask"], dtype=bool)
        d = np.abs(
            np.array(row["rollout_logprobs"], dtype=np.float64)
            - np.array(row["training_logprobs"], dtype=np.float64)
        )[mask]
        by_step.setdefault(row["step"], []).append((row["sample"], float(d.mean())))
    expected: list[tuple[str, int | None, int | None]] = [("step_trend", None, None)]
    shares = []
    for step in sorted(by_step):
        rows = sorted(by_step[step])
        bf16 = [i for i, (_, m) in enumerate(rows) if m > BF16_LEVEL]
        shares.append(len(bf16) / len(rows))
        if 0 < len(bf16) < len(rows):
            expected += [("sample_outliers", step, i) for i in bf16]
    assert shares == sorted(shares) and shares[0] == 0 and shares[-1] == 1  # a rising share
    return expected


def _sealed_bytes(run_dir: Path) -> dict[Path, bytes]:
    """Every file of the run but the pages the text report writes beside it."""
    return {
        p: p.read_bytes()
        for p in run_dir.rglob("*")
        if p.is_file() and not p.name.startswith("report-")
    }


def _named(report: dict[str, Any]) -> list[tuple[str, int | None, int | None]]:
    return [(s["id"], s["step"], s["sample"]) for s in report["signatures"]]


def test_the_example_dumps_name_exactly_the_trend_and_the_mixed_steps_outliers(
    example: dict[str, Any],
) -> None:
    expected = _expected_example()
    assert len(expected) == 1 + 1 + 2 + 3
    assert _named(example["report"]) == expected
    trend = example["report"]["signatures"][0]
    assert trend["scope"] == "run"
    assert trend["evidence"]["first_step"] == 1 and trend["evidence"]["last_step"] == 6
    for entry in example["report"]["signatures"][1:]:
        assert entry["scope"] == "sample" and entry["evidence"]["mean_abs_diff"] > BF16_LEVEL
        assert entry["evidence"]["rest_max_mean_abs_diff"] < BF16_LEVEL


def test_the_same_signatures_on_the_example_sealed_by_the_previous_release(
    tmp_path: Path,
) -> None:
    """Sealed before signatures existed: none in its comparisons, the same named at read time,
    and verify still passes without a byte written."""
    run_dir = tmp_path / "wave4-jsonl"
    shutil.copytree(WAVE4 / "wave4-jsonl", run_dir)
    before = _sealed_bytes(run_dir)
    for attempt in iter_attempt_dirs(run_dir):
        assert "signatures" not in json.loads((attempt / COMPARISON).read_bytes())["diagnostics"]
    code, out, _ = cli("verify", run_dir)
    assert code == 0, out
    report, _ = _report(run_dir)
    assert _named(report) == _expected_example()
    assert _sealed_bytes(run_dir) == before  # computed, never written


def test_each_step_seals_its_signatures_and_verify_passes(example: dict[str, Any]) -> None:
    sealed = {}
    for attempt in iter_attempt_dirs(example["run_dir"]):
        document = json.loads((attempt / COMPARISON).read_bytes())
        sealed[document["label"]] = [
            (s["id"], s["scope"], s.get("sample")) for s in document["diagnostics"]["signatures"]
        ]
    assert sealed == {
        "step=1": [],
        "step=2": [],
        "step=3": [("sample_outliers", "sample", 0)],
        "step=4": [("sample_outliers", "sample", 0), ("sample_outliers", "sample", 1)],
        "step=5": [("sample_outliers", "sample", i) for i in range(3)],
        "step=6": [],
    }
    code, out, _ = cli("verify", example["run_dir"])
    assert code == 0, out


@pytest.mark.slow
def test_findings_text_and_page_lead_with_the_signatures(
    example: dict[str, Any], tmp_path: Path
) -> None:
    lines = example["text"].splitlines()
    table = next(i for i, line in enumerate(lines) if line.startswith("step  outcome"))
    named = [i for i, line in enumerate(lines) if line.startswith("signature ")]
    assert len(named) == 7 and max(named) < table  # before the tables
    assert lines[named[0]].startswith("signature step_trend (the run): ")
    assert lines[named[1]].startswith("signature sample_outliers (step 3, sample 0): ")
    findings = example["report"]["findings"]["signatures"]
    assert [w.split(" ")[0] for w in findings] == [s[0] for s in _expected_example()]
    code, out, err = cli("report", example["run_dir"], "--html", tmp_path / "page.html")
    assert (code, err) == (0, ""), out
    page = (tmp_path / "page.html").read_text()
    assert page.index("id='findings'") < page.index("id='signatures'") < page.index("id='steps'")
    for index in range(1, 8):
        assert f"href='#signature-{index}'" in page and f"id='signature-{index}'" in page
    assert page.count("data-signature='sample_outliers'") == 2 * 6


def _reseal(attempt: Path, document: dict[str, Any]) -> None:
    path = attempt / COMPARISON
    os.chmod(path, 0o644)
    path.write_bytes(json_bytes(document))
    seal = json.loads((attempt / COMPLETE).read_text())
    seal["files"][COMPARISON] = hashlib.sha256(path.read_bytes()).hexdigest()
    os.chmod(attempt / COMPLETE, 0o644)
    (attempt / COMPLETE).write_bytes(json_bytes(seal))


def _step(run_dir: Path, label: str) -> tuple[Path, dict[str, Any]]:
    for attempt in iter_attempt_dirs(run_dir):
        document = json.loads((attempt / COMPARISON).read_bytes())
        if document["label"] == label:
            return attempt, document
    raise AssertionError(label)


@pytest.mark.parametrize(
    ("label", "change", "detail"),
    [
        ("step=3", "evidence", "diagnostics.signatures[0] differs from the signatures recomputed"),
        ("step=4", "drop", "diagnostics.signatures[1] differs from the signatures recomputed"),
        ("step=1", "add", "diagnostics.signatures[0] differs from the signatures recomputed"),
        ("step=3", "type", "$.diagnostics.signatures[0].id: Invalid enum value 'hot'"),
    ],
)
def test_verify_refuses_a_resealed_tampered_signature(
    example: dict[str, Any], tmp_path: Path, label: str, change: str, detail: str
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(example["run_dir"], run_dir)
    attempt, document = _step(run_dir, label)
    signatures = document["diagnostics"]["signatures"]
    if change == "evidence":
        signatures[0]["evidence"]["mean_abs_diff"] *= 2
    elif change == "drop":
        signatures.pop()
    elif change == "add":
        signatures.append({"id": "shifted", "scope": "step", "evidence": {"offset": 1}})
    else:
        signatures[0]["id"] = "hot"
    _reseal(attempt, document)
    code, out, err = cli("verify", run_dir)
    assert (code, err) == (1, ""), out
    (line,) = [line for line in out.splitlines() if attempt.name in line and "invalid" in line]
    assert detail in line, line
    assert "Traceback" not in out


def test_an_evidence_figure_a_last_bit_off_verifies(
    example: dict[str, Any], tmp_path: Path
) -> None:
    """A float64 statistic recomputed on another CPU may differ in its last bits: verify takes
    the re-judge's relative tolerance for evidence figures, never for ids, samples or rows."""
    run_dir = tmp_path / "run"
    shutil.copytree(example["run_dir"], run_dir)
    attempt, document = _step(run_dir, "step=3")
    evidence = document["diagnostics"]["signatures"][0]["evidence"]
    evidence["mean_abs_diff"] = math.nextafter(evidence["mean_abs_diff"], math.inf)
    _reseal(attempt, document)
    code, out, _ = cli("verify", run_dir)
    assert code == 0, out
    document["diagnostics"]["signatures"][0]["sample"] += 1
    _reseal(attempt, document)
    code, out, _ = cli("verify", run_dir)
    assert code == 1 and "diagnostics.signatures[0] differs" in out, out


def test_a_step_resealed_without_signatures_gets_them_at_read_time(
    example: dict[str, Any], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(example["run_dir"], run_dir)
    attempt, document = _step(run_dir, "step=5")
    del document["diagnostics"]["signatures"]
    _reseal(attempt, document)
    code, out, _ = cli("verify", run_dir)
    assert code == 0, out
    report, _ = _report(run_dir)
    assert _named(report) == _named(example["report"])


@pytest.mark.parametrize("run", ["wave4-hf-bf16", "wave4-vllm-weight-sync"])
@pytest.mark.slow
def test_honest_bf16_runs_of_the_previous_release_name_nothing(run: str, tmp_path: Path) -> None:
    run_dir = tmp_path / run
    shutil.copytree(WAVE4 / run, run_dir)
    report, text = _report(run_dir, tmp_path / "page.html")
    assert report["signatures"] == [] and report["findings"]["signatures"] == []
    assert "signature " not in text
    assert "id='signatures'" not in (tmp_path / "page.html").read_text()


@pytest.mark.slow
def test_bf16_decode_with_cache_against_teacher_forcing_with_masked_tool_spans_names_nothing(
    tmp_path: Path,
) -> None:
    """The tiny Qwen3 in bfloat16: the rollout's logprobs from a KV-cache decode of one batch
    (sampled, seeded), the trainer's from one teacher-forced forward; a tool-result span in
    every other sample is logged as 0.0 by the rollout and masked, as a multi-turn run writes
    it. Two steps of four samples."""
    import torch
    from transformers import AutoModelForCausalLM

    from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint

    path = resolve_checkpoint("tiny://qwen3-h64-v1", expected_digest=None).path
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    generator = torch.Generator().manual_seed(5656)
    samples, prompt_length, new_tokens = 8, 6, 40
    ids = torch.randint(10, 1000, (samples, prompt_length), generator=generator)
    rollout = torch.empty(samples, new_tokens)
    with torch.no_grad():  # one batch, no padding: every prompt has the same length
        out = model(input_ids=ids, use_cache=True)
        for t in range(new_tokens):
            logprobs = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
            token = torch.multinomial(logprobs.exp(), 1, generator=generator)
            rollout[:, t] = logprobs.gather(1, token)[:, 0]
            ids = torch.cat([ids, token], dim=1)
            out = model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)
        full = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)
    targets = ids[:, prompt_length:]
    training = full[:, prompt_length - 1 : -1].gather(2, targets[..., None])[..., 0]
    lines = []
    for sample in range(samples):
        logged, mask = rollout[sample].tolist(), [1] * new_tokens
        if sample % 2:
            for t in range(12, 20):  # a tool result: not the policy's tokens
                logged[t], mask[t] = 0.0, 0
        lines.append(
            json.dumps(
                {
                    "step": 1 + sample // 4,
                    "sample": sample,
                    "token_ids": ids[sample].tolist(),
                    "prompt_length": prompt_length,
                    "rollout_logprobs": logged,
                    "training_logprobs": training[sample].tolist(),
                    "mask": mask,
                }
            )
        )
    source = tmp_path / "bf16.jsonl"
    source.write_text("\n".join(lines) + "\n")
    run_dir = _import(tmp_path / "artifacts", source, "bf16-tool-spans")
    report, _ = _report(run_dir)
    assert [s["outcome"] for s in report["steps"]["steps"]] == ["MISMATCH", "MISMATCH"]
    assert report["signatures"] == []
    # the control: the same spans left active are named, on exactly the samples that hold them
    from pytest_logprob_drift.numerics.signatures import step_signatures

    zeroed = rollout.clone()
    zeroed[1::2, 12:20] = 0.0
    found = step_signatures(
        training.double().numpy(), zeroed.double().numpy(), np.ones((samples, new_tokens), bool)
    )
    assert [(s.id.value, s.sample) for s in found] == [("zero_filled", i) for i in (1, 3, 5, 7)]


def test_executed_cases_seal_their_signatures(sealed_s0: Path, tmp_path: Path) -> None:
    """The cpu-smoke run's cases (one rollout shifted by a constant 0.008 nats): each judged
    case seals a list, empty here: the constant offset keeps exp(-0.008) = 0.992 of the mass,
    above the 0.99 a truncation must lose, which this test computes from token_diffs.pt."""
    import torch

    runs = copy_of_s0(sealed_s0, tmp_path)
    for attempt in iter_attempt_dirs(runs / "s0-cpu-smoke"):
        document = json.loads((attempt / COMPARISON).read_bytes())
        assert document["diagnostics"]["signatures"] == [], document["label"]
        diffs = torch.load(attempt / "token_diffs.pt", weights_only=True)
        active = diffs["active_mask"]
        d = (
            diffs["rollout_logprobs"].to(torch.float64)
            - diffs["training_logprobs"].to(torch.float64)
        )[active]
        assert float(torch.exp(-d).mean()) > 0.99
    code, out, _ = cli("verify", runs / "s0-cpu-smoke")
    assert code == 0, out


def test_a_grid_of_three_shapes_is_refused_and_few_tokens_name_nothing() -> None:
    from pytest_logprob_drift.numerics.signatures import run_signatures, step_signatures

    with pytest.raises(ValueError, match=r"three \[B, T\] arrays of one shape"):
        step_signatures(np.zeros((2, 3)), np.zeros((2, 4)), np.ones((2, 3), dtype=bool))
    training = np.full((2, 8), -2.0)
    # tempered, truncated and grown all at once, but on 16 tokens: too few to say
    assert step_signatures(training, training * 2 + 0.1 * np.arange(8), np.ones((2, 8), bool)) == []
    # three steps: too few for a jump (two each side) or a trend (five)
    assert run_signatures([(1, 0.001), (2, 0.1), (3, 0.1)]) == []
    assert run_signatures([(1, 0.001), (2, 0.002), (3, 0.004), (4, 0.008)]) == []
