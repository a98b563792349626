"""Replay on the ``hf`` runtime (issue 22): a real tiny bf16 experiment run twice through the
CLI, with ``diagnostics.replay`` on and off.

Everything claimed about the sealed replay is checked against computations written here:
the path-split figures and the float64 identity from the sealed tensors, the prefill replay
against a plain transformers forward of the rollout model, the decode replay against the
sampled logprobs, the attribution by path against a recompute of the shared tokens, and
``verify`` against tampered and resealed replay files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import EXPERIMENTS, cli, experiment_config

from pytest_logprob_drift.diagnostics.path_split.attribution import (
    PATH_BOTH,
    PATH_DECODE_ONLY,
    PATH_NO_EFFECT,
    PATH_PREFILL_ONLY,
    PATH_TRAINING,
)
from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint
from pytest_logprob_drift.store.files import json_bytes
from pytest_logprob_drift.store.layout import COMPLETE
from pytest_logprob_drift.tensorio import tensor_bytes

pytestmark = pytest.mark.slow

PREFILL = "score_rollout_prefill.pt"
DECODE_REPLAY = "score_rollout_decode_replay.pt"


def _config(directory: Path, replay: bool) -> Path:
    source = "cross_config_s0_hf_tiny_bf16.json"
    prompts = json.loads((EXPERIMENTS / source).read_text())["identity"]["prompts"]["token_ids"]
    changes: dict[str, Any] = {
        "experiment_id": "hf-replay-" + ("on" if replay else "off"),
        "identity.prompts.token_ids": prompts[:6],
        "identity.sampling.max_new_tokens": 8,
        "baseline.batch.size": 3,
        "interventions": [
            {"path": "batch.size", "values": [1]},
            {"path": "rollout.dtype", "values": ["float32"]},
            {"path": "training.compute_dtype", "values": ["float32"]},
        ],
    }
    if replay:
        changes["diagnostics"] = {"replay": True}
    return experiment_config(directory, source, changes)


def _load(path: Path) -> dict[str, torch.Tensor]:
    loaded: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return loaded


def _run(directory: Path, replay: bool) -> dict[str, Any]:
    config = _config(directory, replay)
    artifacts = directory / "runs"
    code, out, err = cli("run", config, "--runtime", "hf", "--artifacts", artifacts, "--json")
    assert code == 1, err[-3000:]  # bf16: the baseline is a MISMATCH
    document = json.loads(out)
    run_dir = artifacts / json.loads(config.read_text())["experiment_id"]
    cases = {}
    for path in (run_dir / "cases").glob("*/*/comparison.json"):
        comparison = json.loads(path.read_text())
        cases[comparison["label"]] = {"comparison": comparison, "attempt": path.parent}
    return {"json": document, "cases": cases, "run_dir": run_dir, "config": config}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    directory = tmp_path_factory.mktemp("replay-hf")
    return {"on": _run(directory, True), "off": _run(directory, False)}


@pytest.fixture(scope="module")
def on(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return runs["on"]


def test_every_case_carries_the_split_and_its_figures_are_the_sealed_tensors(
    on: dict[str, Any],
) -> None:
    assert set(on["cases"]) == {
        "baseline",
        "batch.size=1",
        "rollout.dtype=float32",
        "training.compute_dtype=float32",
    }
    for label, case in on["cases"].items():
        split = case["comparison"]["diagnostics"]["path_split"]
        assert split["prefill"]["status"] == "replay_ran", label
        assert split["decode_replay"]["status"] == "replay_ran", label
        assert split["comparable"] == dict.fromkeys(
            ("decode_prefill", "prefill_training", "decode_training"), True
        )
        attempt = case["attempt"]
        rollout, training = (
            _load(attempt / "score_rollout.pt"),
            _load(attempt / "score_training.pt"),
        )
        prefill, replay = _load(attempt / PREFILL), _load(attempt / DECODE_REPLAY)
        active = rollout["active_mask"]
        d = rollout["logprobs"].double()[active]
        p = prefill["logprobs"].double()[active]
        t = training["logprobs"].double()[active]
        # the exact identity, per token, in float64
        assert torch.equal(d - t, (d - p) + (p - t)), label
        figures = split["figures"]
        assert figures["active_tokens"] == int(active.sum())
        for pair, diff in (
            ("decode_prefill", d - p),
            ("prefill_training", p - t),
            ("decode_training", d - t),
        ):
            assert figures[pair]["max"] == float(diff.abs().max()), (label, pair)
            assert figures[pair]["mean"] == pytest.approx(float(diff.abs().mean()), rel=1e-12)
            assert figures[pair]["p99"] == pytest.approx(
                float(torch.quantile(diff.abs(), 0.99)), rel=1e-12
            )
        same = rollout["logprobs"][active].view(torch.int32) == prefill["logprobs"][active].view(
            torch.int32
        )
        assert figures["bitwise_equal_fraction"] == pytest.approx(float(same.double().mean()))
        firsts = []
        for row in range(active.shape[0]):
            a = rollout["logprobs"][row][active[row]].view(torch.int32)
            b = prefill["logprobs"][row][active[row]].view(torch.int32)
            where = (a != b).nonzero().flatten().tolist()
            firsts.append(where[0] if where else None)
        assert figures["first_difference"] == firsts
        # the replays scored exactly the sampled tokens, on the same grid and masks
        for sealed in (prefill, replay):
            assert torch.equal(
                sealed["token_ids"][rollout["attention_mask"]],
                rollout["token_ids"][rollout["attention_mask"]],
            )
            assert torch.equal(sealed["active_mask"], active)
            assert torch.equal(sealed["attention_mask"], rollout["attention_mask"])


def test_decode_replay_reproduces_the_sampled_logprobs(on: dict[str, Any]) -> None:
    """The transformers rollout decodes the same way twice: its forced KV-cache replay gives
    back every sampled logprob bit for bit, and comparison.json says so."""
    for label, case in on["cases"].items():
        rollout = _load(case["attempt"] / "score_rollout.pt")
        replay = _load(case["attempt"] / DECODE_REPLAY)
        active = rollout["active_mask"]
        assert torch.equal(replay["logprobs"][active], rollout["logprobs"][active]), label
        figures = case["comparison"]["diagnostics"]["path_split"]["figures"]
        assert figures["decode_replay_decode"]["bitwise_equal_fraction"] == 1.0
        assert figures["decode_replay_decode"]["max"] == 0.0


def _plain_prefill(model: Any, rollout: dict[str, torch.Tensor], chunk: int) -> torch.Tensor:
    """The rollout model's teacher-forced logprobs, written here with plain transformers:
    right-padded chunks, log_softmax in the logits' dtype, the logit at t-1 scores t."""
    ids, attention = rollout["token_ids"], rollout["attention_mask"]
    out = torch.zeros(ids.shape, dtype=torch.float32)
    with torch.no_grad():
        for start in range(0, ids.shape[0], chunk):
            rows = slice(start, start + chunk)
            width = int(attention[rows].sum(-1).max())
            logits = model(
                input_ids=ids[rows, :width],
                attention_mask=attention[rows, :width].long(),
                position_ids=rollout["position_ids"][rows, :width],
                use_cache=False,
            ).logits[:, :-1]
            logp = torch.log_softmax(logits, dim=-1)
            picked = logp.gather(-1, ids[rows, 1:width].unsqueeze(-1)).squeeze(-1).float()
            out[rows, 1:width] = picked
    return torch.where(rollout["active_mask"], out, torch.zeros_like(out))


def test_prefill_replay_is_the_rollout_models_own_teacher_forced_forward(
    on: dict[str, Any],
) -> None:
    import transformers

    path = resolve_checkpoint("tiny://qwen3-h64-v1", expected_digest=None).path
    for label, dtype, chunk in (
        ("baseline", torch.bfloat16, 3),
        ("batch.size=1", torch.bfloat16, 1),
        ("rollout.dtype=float32", torch.float32, 3),
    ):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, attn_implementation="sdpa", local_files_only=True
        ).eval()
        attempt = on["cases"][label]["attempt"]
        rollout = _load(attempt / "score_rollout.pt")
        expected = _plain_prefill(model, rollout, chunk)
        torch.testing.assert_close(_load(attempt / PREFILL)["logprobs"], expected, rtol=0, atol=0)


def test_the_fp32_rollouts_decode_and_prefill_agree_within_fp32_noise(on: dict[str, Any]) -> None:
    figures = on["cases"]["rollout.dtype=float32"]["comparison"]["diagnostics"]["path_split"][
        "figures"
    ]
    rollout = _load(on["cases"]["rollout.dtype=float32"]["attempt"] / "score_rollout.pt")
    scale = float(rollout["logprobs"][rollout["active_mask"]].abs().max())
    # a few hundred float32 ulps of the largest logprob: summation order, nothing more
    bound = 512 * torch.finfo(torch.float32).eps * max(scale, 1.0)
    assert figures["decode_prefill"]["max"] <= bound


def test_replay_changes_no_verdict_mismatch_count_case_id_or_score(
    runs: dict[str, dict[str, Any]],
) -> None:
    on, off = runs["on"], runs["off"]
    assert set(on["cases"]) == set(off["cases"])
    for label in on["cases"]:
        a, b = on["cases"][label], off["cases"][label]
        for key in ("case_id", "outcome", "mismatches", "active_tokens", "numerical"):
            assert a["comparison"][key] == b["comparison"][key], (label, key)
        assert "path_split" not in b["comparison"]["diagnostics"]
        for name in ("score_rollout.pt", "score_training.pt", "token_diffs.pt"):
            assert (a["attempt"] / name).read_bytes() == (b["attempt"] / name).read_bytes()
        assert not (b["attempt"] / PREFILL).exists() and not (b["attempt"] / DECODE_REPLAY).exists()


def _shared(case: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> torch.Tensor:
    """Active in both, before each sample's first differing token (written here)."""
    mask = torch.zeros(case["token_ids"].shape, dtype=torch.bool)
    for row in range(mask.shape[0]):
        start = int(case["prompt_lengths"][row])
        a = case["token_ids"][row][case["attention_mask"][row]][start:].tolist()
        b = ref["token_ids"][row][ref["attention_mask"][row]][start:].tolist()
        for k in range(min(len(a), len(b))):
            if a[k] != b[k]:
                break
            if case["active_mask"][row, start + k] and ref["active_mask"][row, start + k]:
                mask[row, start + k] = True
    return mask


def _expected_path(decode: bool, prefill: bool, training: bool) -> str:
    words = {
        (True, True): PATH_BOTH,
        (True, False): PATH_DECODE_ONLY,
        (False, True): PATH_PREFILL_ONLY,
    }
    parts = [words[(decode, prefill)]] if decode or prefill else []
    parts += [PATH_TRAINING] if training else []
    return "; ".join(parts) or PATH_NO_EFFECT


def test_attribution_by_path_is_what_the_sealed_scores_say(on: dict[str, Any]) -> None:
    attributions = sorted((on["run_dir"] / "attributions").glob("*/attribution.json"))
    document = json.loads(attributions[-1].read_text())
    base = on["cases"]["baseline"]["attempt"]
    ref = {n: _load(base / n) for n in ("score_rollout.pt", "score_training.pt", PREFILL)}
    assert document["noise_floor"]["measured"] is False  # any movement counts
    entries = {e["label"]: e for e in document["cases"]}
    assert set(entries) == set(on["cases"]) - {"baseline"}
    for label, entry in entries.items():
        attempt = on["cases"][label]["attempt"]
        case = {n: _load(attempt / n) for n in ("score_rollout.pt", "score_training.pt", PREFILL)}
        shared = _shared(case["score_rollout.pt"], ref["score_rollout.pt"])
        moved = {}
        for name in ("score_rollout.pt", PREFILL, "score_training.pt"):
            delta = (case[name]["logprobs"].double() - ref[name]["logprobs"].double())[shared]
            moved[name] = bool(delta.numel()) and float(delta.abs().max()) > 0.0
            if name == PREFILL:
                assert entry["path"]["prefill"]["max_abs_delta"] == (
                    float(delta.abs().max()) if delta.numel() else 0.0
                )
        assert entry["path"]["classification"] == _expected_path(
            moved["score_rollout.pt"], moved[PREFILL], moved["score_training.pt"]
        ), label
    # the report's findings name each mover's path as the sealed (and here recomputed) entry
    code, out, err = cli("report", on["run_dir"], "--json")
    assert code == 0, err
    moved = json.loads(out)["findings"]["moved"]
    by_case = {e["case_id"]: e for e in entries.values()}
    assert moved, "with bf16 on the rollout some knob moves a side"
    for finding in moved:
        words = by_case[finding["case_id"]]["path"]["classification"]
        assert finding["facts"]["path:"] == words
        assert f"; path: {words}" in finding["words"]


def test_run_prints_the_split_columns_and_where_the_drift_entered(
    on: dict[str, Any], tmp_path: Path
) -> None:
    code, out, err = cli(
        "run", on["config"], "--runtime", "hf", "--artifacts", on["run_dir"].parent
    )
    assert code == 1, err[-2000:]
    assert "max|dec-pre|" in out and "max|pre-train|" in out
    assert "where the drift entered (decode vs prefill, against the baseline):" in out
    assert "baseline: path split: decode-prefill max" in out


def test_verify_accepts_the_replay_and_recomputes_it(on: dict[str, Any]) -> None:
    code, out, err = cli("verify", on["run_dir"], "--json")
    assert code == 0, out[-3000:] + err[-2000:]


def _copy_run(on: dict[str, Any], tmp_path: Path) -> tuple[Path, Path]:
    run_dir = tmp_path / on["run_dir"].name
    shutil.copytree(on["run_dir"], run_dir)
    baseline = on["cases"]["baseline"]["attempt"]
    attempt = run_dir / baseline.relative_to(on["run_dir"])
    for path in attempt.iterdir():
        os.chmod(path, 0o644)
    return run_dir, attempt


def _reseal(attempt: Path) -> None:
    """Rewrite COMPLETE with every file's current digest (write access, no key)."""
    document: dict[str, Any] = json.loads((attempt / COMPLETE).read_text())
    document["files"] = {
        name: hashlib.sha256((attempt / name).read_bytes()).hexdigest()
        for name in document["files"]
    }
    (attempt / COMPLETE).write_bytes(json_bytes(document))


def _invalid(run_dir: Path) -> list[dict[str, Any]]:
    code, out, _ = cli("verify", run_dir, "--json")
    assert code == 1, out[-2000:]
    return [a for a in json.loads(out)["attempts"] if a["status"] == "invalid"]


def test_verify_catches_a_tampered_replay_file(on: dict[str, Any], tmp_path: Path) -> None:
    run_dir, attempt = _copy_run(on, tmp_path)
    data = bytearray((attempt / PREFILL).read_bytes())
    data[len(data) // 2] ^= 0x01
    (attempt / PREFILL).write_bytes(bytes(data))
    (bad,) = _invalid(run_dir)
    assert bad["file"] == PREFILL


@pytest.mark.parametrize("name", [PREFILL, DECODE_REPLAY])
def test_verify_refuses_a_resealed_replay_of_other_tokens(
    on: dict[str, Any], tmp_path: Path, name: str
) -> None:
    run_dir, attempt = _copy_run(on, tmp_path)
    sealed = _load(attempt / name)
    row = 0
    position = int(sealed["attention_mask"][row].sum()) - 1
    sealed["token_ids"][row, position] += 1
    (attempt / name).write_bytes(tensor_bytes(sealed))
    _reseal(attempt)
    (bad,) = _invalid(run_dir)
    assert bad["file"] == name
    assert f"at row 0, position {position}" in bad["detail"] and "refused" in bad["detail"]


def test_verify_refuses_resealed_replay_logprobs_the_figures_do_not_match(
    on: dict[str, Any], tmp_path: Path
) -> None:
    run_dir, attempt = _copy_run(on, tmp_path)
    sealed = _load(attempt / PREFILL)
    first = sealed["active_mask"].nonzero()[0]
    sealed["logprobs"][first[0], first[1]] -= 0.5
    (attempt / PREFILL).write_bytes(tensor_bytes(sealed))
    _reseal(attempt)
    (bad,) = _invalid(run_dir)
    assert bad["file"] == PREFILL
    assert "recomputed offline differs" in bad["detail"]


def test_verify_refuses_a_recorded_replay_whose_file_is_not_sealed(
    on: dict[str, Any], tmp_path: Path
) -> None:
    run_dir, attempt = _copy_run(on, tmp_path)
    (attempt / DECODE_REPLAY).unlink()
    document: dict[str, Any] = json.loads((attempt / COMPLETE).read_text())
    del document["files"][DECODE_REPLAY]
    (attempt / COMPLETE).write_bytes(json_bytes(document))
    (bad,) = _invalid(run_dir)
    assert bad["file"] == DECODE_REPLAY
    assert "not sealed" in bad["detail"]


def test_the_report_draws_the_split_of_every_case(on: dict[str, Any], tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    code, _, err = cli("report", on["run_dir"], "--html", page)
    assert code == 0, err[-2000:]
    html = page.read_text()
    for name in ("path-split", "path-split-position"):
        assert html.count(f"data-plot='{name}'") == len(on["cases"]), name
    from pytest_logprob_drift.diagnostics.path_split.plot import plot_data
    from pytest_logprob_drift.numerics.comparison import PathSplit, from_builtins

    for label, case in on["cases"].items():
        rollout = _load(case["attempt"] / "score_rollout.pt")
        prefill = _load(case["attempt"] / PREFILL)["logprobs"]
        training = _load(case["attempt"] / "score_training.pt")["logprobs"]
        split = from_builtins(case["comparison"]["diagnostics"]["path_split"], PathSplit)
        plot = plot_data(rollout, prefill, training, split)
        active = rollout["active_mask"]
        d, p = rollout["logprobs"].double(), prefill.double()
        diff = (d - p).abs()
        # every active token is counted once: a bin or exactly 0 (none is below 1e-12 here)
        values = diff[active]
        assert bool(((values == 0) | (values >= 1e-12)).all())
        assert int(plot.counts["decode_prefill"].sum()) + plot.zeros["decode_prefill"] == int(
            active.sum()
        )
        # per response position: the max over samples, computed here row by row
        line = plot.by_position["decode_prefill"]
        for offset in range(line.size):
            here = [
                float(diff[row, int(rollout["prompt_lengths"][row]) + offset])
                for row in range(active.shape[0])
                if int(rollout["prompt_lengths"][row]) + offset < active.shape[1]
                and bool(active[row, int(rollout["prompt_lengths"][row]) + offset])
            ]
            assert line[offset] == max(here), (label, offset)


def test_processed_rollout_logprobs_compare_only_with_the_processed_prefill(
    tmp_path: Path,
) -> None:
    """Temperature 0.7 and ``rollout.logprobs_mode=processed_logprobs`` against a raw trainer:
    the hf prefill replay reports processed logprobs too, so decode vs prefill compares and
    the two pairs with the raw trainer are marked incomparable (no figures), never compared."""
    config = json.loads((EXPERIMENTS / "cross_config_s0_hf_tiny_bf16.json").read_text())
    config["experiment_id"] = "hf-replay-processed"
    config["identity"]["prompts"]["token_ids"] = config["identity"]["prompts"]["token_ids"][:4]
    config["identity"]["sampling"].update(max_new_tokens=6, temperature=0.7)
    config["baseline"]["batch"]["size"] = 2
    config["baseline"]["rollout"]["logprobs_mode"] = "processed_logprobs"
    config["interventions"] = []
    config["diagnostics"] = {"replay": True}
    path = tmp_path / "processed.json"
    path.write_text(json.dumps(config))
    code, out, err = cli("run", path, "--runtime", "hf", "--artifacts", tmp_path / "runs")
    assert code in (0, 1), err[-2000:]
    (comparison,) = (tmp_path / "runs").glob("*/cases/*/*/comparison.json")
    split = json.loads(comparison.read_text())["diagnostics"]["path_split"]
    assert split["comparable"] == {
        "decode_prefill": True,
        "prefill_training": False,
        "decode_training": False,
    }
    assert split["prefill"]["status"] == "replay_ran"
    assert split["prefill"]["evidence"]["logprob_semantics"] == "processed"
    figures = split["figures"]
    assert figures["prefill_training"] is None and figures["decode_training"] is None
    rollout = _load(comparison.parent / "score_rollout.pt")
    prefill = _load(comparison.parent / PREFILL)
    active = rollout["active_mask"]
    diff = (rollout["logprobs"].double() - prefill["logprobs"].double())[active]
    assert figures["decode_prefill"]["max"] == float(diff.abs().max())
    assert "incomparable" in out  # the run table's max|pre-train| cell
    assert cli("verify", comparison.parents[3])[0] == 0
