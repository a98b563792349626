"""The ``vllm-hf`` runtime: the S1 experiment through the pytest plugin with the real vLLM engine,
with ``logp.backend`` on the vLLM rollout side and vLLM's float32 LM head (issue 33) on it.

One real pytest run (pytester, in a subprocess) executes every S1 case plus the contract's
``logp.backend`` interventions (``rlkernel.reference_logp``, ``rlkernel.chunked_logp`` and the
test-only ``smoke_only.logp_rollout_offset``) and ``rollout.lm_head_dtype=float32`` (alone, and
paired with ``rollout.dtype=bfloat16``), with the prefill replay on (so the prompt-logprobs
path runs the backend too); the tests then read the sealed artifacts it left. (The lying
adapter, an fp32 engine handed to a bf16 case, runs on the shared engine of
``test_vllm_engine.py``.)

What must show: the S1 verdicts, engine settings and TP 2 workers read back from vLLM; no case
is STRICT_REJECTED; the rollout offset moves the rollout side's sealed scores by exactly the
offset against the same float32 formula (the reference case's sealed scores) and nothing else,
which proves the injection is live; the production backends' rollout logprobs equal the
backend's formula applied here to logits taken from a plain ``vllm.LLM`` through its own
``collective_rpc`` (not from the project's engine); the float32 head executes, every worker
reads back float32 logits at the sampler over a bfloat16 head weight, its prefill replay equals
a float32 head computed here from the plain engine's final hidden states (and not the bfloat16
head), and the attribution says it moved the rollout side; the bf16 rollout's sealed prefill
replay is exactly what that plain bfloat16 engine gives for the sealed sequences (one plain
engine per dtype for the module).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from drift_testing import S1, plugin_run, skip_unless_installed  # noqa: E402

from pytest_logprob_drift.runtimes.batch import sequences  # noqa: E402
from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint  # noqa: E402
from pytest_logprob_drift.tensorio import tensors_from_bytes  # noqa: E402

skip_unless_installed("vllm")

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow

REFERENCE = "rlkernel.reference_logp"
CHUNKED = "rlkernel.chunked_logp"
OFFSET = "smoke_only.logp_rollout_offset"
HEAD = "rollout.lm_head_dtype=float32"
PAIR = "rollout.dtype=bfloat16,rollout.lm_head_dtype=float32"
OFFSET_NATS = 0.008  # 8x the ws1 threshold
MISMATCHES = ("rollout.dtype=bfloat16", f"logp.backend={OFFSET}", PAIR)


@pytest.fixture(scope="module")
def s1_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the whole S1 experiment, with the rollout-side ``logp.backend`` and float32-head
    cases added, once through the plugin (real pytest, subprocess)."""
    document: dict[str, Any] = json.loads(S1.read_text())
    document["strategy"] = "pairwise"
    document["baseline"]["rollout"]["lm_head_dtype"] = "compute"
    document["interventions"] = [
        *document["interventions"],
        {"path": "logp.backend", "values": [REFERENCE, CHUNKED, OFFSET]},
        {"path": "rollout.lm_head_dtype", "values": ["float32"]},
    ]
    document["pairs"] = [["rollout.dtype", "rollout.lm_head_dtype"]]
    document["diagnostics"] = {"replay": True}
    config = tmp_path_factory.mktemp("config") / S1.name
    config.write_text(json.dumps(document))
    workdir = tmp_path_factory.mktemp("s1")
    run = plugin_run(
        workdir,
        config,
        "--drift-allow-smoke-operators",
        *(option for label in MISMATCHES for option in ("--drift-expect", f"{label}=MISMATCH")),
        "--junitxml",
        workdir / "junit.xml",
        runtime="vllm-hf",
    )
    assert run["run_dir"].name == "s1-vllm-cpu-tiny"
    (attribution,) = run["run_dir"].glob("attributions/*/attribution.json")
    return {
        **run,
        "attempts": {label: case["attempt"] for label, case in run["cases"].items()},
        "identity": document["identity"],
        "attribution": json.loads(attribution.read_text()),
    }


def test_s1_through_the_plugin_gives_the_expected_verdicts(s1_run: dict[str, Any]) -> None:
    proc = s1_run["proc"]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "12 passed" in proc.stdout
    assert "9 PASS, 3 MISMATCH" in proc.stdout
    outcomes = {label: c["comparison"]["outcome"] for label, c in s1_run["cases"].items()}
    assert outcomes == {
        "baseline": "PASS",
        "batch.size=1": "PASS",
        "rollout.dtype=bfloat16": "MISMATCH",
        "rollout.tensor_parallel_size=2": "PASS",
        "training.sharding=fsdp": "PASS",
        "rollout.enforce_eager=false": "PASS",
        "rollout.enable_prefix_caching=true": "PASS",
        f"logp.backend={REFERENCE}": "PASS",
        f"logp.backend={CHUNKED}": "PASS",
        f"logp.backend={OFFSET}": "MISMATCH",
        HEAD: "PASS",
        PAIR: "MISMATCH",
    }
    baseline = s1_run["cases"]["baseline"]["comparison"]
    assert baseline["diagnostics"]["max_abs_diff"] < 1e-4


def test_tp2_case_ran_two_vllm_workers(s1_run: dict[str, Any]) -> None:
    attempt = s1_run["cases"]["rollout.tensor_parallel_size=2"]["attempt"]
    actual = json.loads((attempt / "actual.json").read_text())
    assert actual["knobs"]["rollout.tensor_parallel_size"]["actual"] == 2
    assert actual["knobs"]["rollout.tensor_parallel_size"]["status"] == "applied"
    assert actual["read_back"]["vllm.num_worker_processes"] == 2
    assert actual["read_back"]["vllm.tensor_parallel_size"] == 2
    # TP vocabulary layout is derived and recorded.
    assert "vllm.vocab_layout" in actual["read_back"]


def test_engine_settings_are_read_back_from_vllm(s1_run: dict[str, Any]) -> None:
    cases = s1_run["cases"]
    knobs = json.loads(
        (cases["rollout.enforce_eager=false"]["attempt"] / "actual.json").read_text()
    )["knobs"]
    assert knobs["rollout.enforce_eager"]["actual"] is False
    knobs = json.loads(
        (cases["rollout.enable_prefix_caching=true"]["attempt"] / "actual.json").read_text()
    )["knobs"]
    assert knobs["rollout.enable_prefix_caching"]["actual"] is True
    knobs = json.loads((cases["rollout.dtype=bfloat16"]["attempt"] / "actual.json").read_text())[
        "knobs"
    ]
    assert knobs["rollout.dtype"]["actual"] == "bfloat16"
    fsdp = json.loads((cases["training.sharding=fsdp"]["attempt"] / "actual.json").read_text())
    assert fsdp["training_evidence"]["world_size"] == 2


def test_junitxml_carries_the_verdicts(s1_run: dict[str, Any], tmp_path: Path) -> None:
    proc = s1_run["proc"]
    assert proc.returncode == 0
    junit = Path(proc.args[proc.args.index("--junitxml") + 1]).read_text()
    assert 'name="drift_outcome" value="MISMATCH"' in junit


def _outcome(attempt: Path) -> tuple[str, str]:
    comparison = json.loads((attempt / "comparison.json").read_text())
    return str(comparison["outcome"]), str(comparison["reason"])


def _actual(attempt: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((attempt / "actual.json").read_text())
    return document


def _rollout(attempt: Path, name: str = "score_rollout.pt") -> dict[str, Any]:
    return tensors_from_bytes((attempt / name).read_bytes())


def test_every_case_executes_and_the_backends_are_what_ran(s1_run: dict[str, Any]) -> None:
    proc = s1_run["proc"]
    # the three MISMATCH cases are expected (--drift-expect): anything else fails the session
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cases = s1_run["attempts"]
    assert sorted(cases) == sorted(
        [
            "baseline",
            "batch.size=1",
            "rollout.dtype=bfloat16",
            "rollout.tensor_parallel_size=2",
            "training.sharding=fsdp",
            "rollout.enforce_eager=false",
            "rollout.enable_prefix_caching=true",
            *(f"logp.backend={backend}" for backend in (REFERENCE, CHUNKED, OFFSET)),
            HEAD,
            PAIR,
        ]
    )
    for label, attempt in cases.items():
        outcome, reason = _outcome(attempt)
        assert outcome != "STRICT_REJECTED", (label, reason)
    for backend in (REFERENCE, CHUNKED):
        attempt = cases[f"logp.backend={backend}"]
        assert _outcome(attempt)[0] == "PASS"
        actual = _actual(attempt)
        record = actual["knobs"]["logp.backend"]
        assert (record["status"], record["actual"]) == ("applied", backend)
        evidence = actual["read_back"]["vllm.logp_evidence"]
        assert "installed in the sampler of all 1 worker(s)" in evidence, evidence
        (worker,) = actual["read_back"]["vllm.logp_injection"]
        assert worker["backend"] == backend and worker["installed"] is True
        assert worker["model_runner"] == "CPUModelRunner" and worker["sampler_class"] == "Sampler"
        assert not any(worker["violations"].values())
        # the prefill replay's prompt logprobs ran the backend too
        diagnostics = json.loads((attempt / "comparison.json").read_text())["diagnostics"]
        prefill = diagnostics["path_split"]["prefill"]
        assert prefill["status"] == "replay_ran", prefill
        assert prefill["evidence"]["logp_backend"] == backend
    baseline = _actual(cases["baseline"])
    assert baseline["knobs"]["logp.backend"]["actual"] == "native"
    (worker,) = baseline["read_back"]["vllm.logp_injection"]
    assert worker == {**worker, "installed": False, "untouched": True}


def test_the_rollout_offset_is_exactly_the_offset_on_the_rollout_side(
    s1_run: dict[str, Any],
) -> None:
    cases = s1_run["attempts"]
    offset, reference = cases[f"logp.backend={OFFSET}"], cases[f"logp.backend={REFERENCE}"]
    assert _outcome(offset)[0] == "MISMATCH"
    moved, same = _rollout(offset), _rollout(reference)
    assert torch.equal(moved["token_ids"], same["token_ids"])
    active = moved["active_mask"].bool()
    # the same float32 formula (log_softmax(logits.float()) gathered), minus the offset
    assert torch.equal(moved["logprobs"][active], same["logprobs"][active] - OFFSET_NATS)
    for replay in ("score_rollout_prefill.pt",):
        assert torch.equal(
            _rollout(offset, replay)["logprobs"][active],
            _rollout(reference, replay)["logprobs"][active] - OFFSET_NATS,
        )
    trained = tensors_from_bytes((offset / "score_training.pt").read_bytes())["logprobs"]
    trained_ref = tensors_from_bytes((reference / "score_training.pt").read_bytes())["logprobs"]
    assert torch.equal(trained[active], trained_ref[active])  # the training side never moved


def _plain_engine(model_dir: Path, dtype: str, seed: int) -> Any:
    from vllm import LLM

    return LLM(
        model=str(model_dir),
        tokenizer=str(model_dir),
        skip_tokenizer_init=True,
        dtype=dtype,  # type: ignore[arg-type]
        seed=seed,
        max_model_len=64,
        kv_cache_memory_bytes=64 * 1024 * 1024,
        enforce_eager=True,
        enable_prefix_caching=False,  # as the S1 cases' engines (and nothing cached to reuse)
    )


@pytest.fixture(scope="module")
def bf16_engine(s1_run: dict[str, Any]) -> Iterator[Any]:
    """One plain bfloat16 ``vllm.LLM`` (not the project's engine) for the module's bf16
    checks: the float32 head computed here, and the prefill replay redone here."""
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    checkpoint = resolve_checkpoint(s1_run["identity"]["checkpoint"]["uri"], expected_digest=None)
    llm = _plain_engine(checkpoint.path, "bfloat16", int(s1_run["identity"]["sampling"]["seed"]))
    yield llm
    llm.llm_engine.engine_core.shutdown()
    del llm


def _prompt_path_captures(llm: Any, rows: list[list[int]]) -> list[tuple[Any, Any, Any]]:
    """``(hidden states, logits, lm_head weight)`` of each row's prompt positions, from a plain
    engine: a forward hook on the model's ``logits_processor`` installed through the engine's
    own ``collective_rpc``, the rows submitted together as prompt-logprobs requests
    (``prompt_logprobs=0``, ``max_tokens=1``, as the prefill replay submits them)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    def arm(worker: Any) -> int:
        import torch as wtorch

        model = worker.get_model()
        store = model.__dict__.setdefault("_test_captures", [])
        store.clear()
        if not model.__dict__.get("_test_hooked"):

            def hook(_module: Any, args: Any, out: Any) -> None:
                store.append((args[1].detach().clone(), out.detach().clone()))

            model.logits_processor.register_forward_hook(hook)
            model.__dict__["_test_hooked"] = True
        return int(wtorch.tensor(0).item())

    def collect(worker: Any) -> bytes:
        import io

        import torch as wtorch

        model = worker.get_model()
        buffer = io.BytesIO()
        wtorch.save(
            {
                "calls": list(model.__dict__["_test_captures"]),
                "weight": model.lm_head.weight.detach().clone(),
            },
            buffer,
        )
        return buffer.getvalue()

    llm.collective_rpc(arm)
    params = SamplingParams(n=1, max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
    llm.generate([TokensPrompt(prompt_token_ids=r) for r in rows], [params] * len(rows))
    (sent,) = llm.collective_rpc(collect)
    got = torch.load(io.BytesIO(sent), weights_only=True)
    # Each engine step: the sampled positions' logits (``[k, V]``, one row per request of the
    # step) first, then each of those k requests' prompt positions, requests in submission
    # order (the scheduler is first come, first served).
    calls = list(got["calls"])
    prompt_calls = []
    at = 0
    while at < len(calls):
        step = int(calls[at][0].shape[0])
        prompt_calls += calls[at + 1 : at + 1 + step]
        at += 1 + step
    for row, (hidden, _logits) in zip(rows, prompt_calls, strict=True):
        assert hidden.shape[0] == len(row) - 1, (hidden.shape, len(row))
    return [(h, o, got["weight"]) for h, o in prompt_calls]


def _sealed_rows(attempt: Path, name: str) -> tuple[list[list[int]], Any, Any]:
    tensors = _rollout(attempt, name)
    rollout = _rollout(attempt)
    return sequences(rollout), tensors["logprobs"], rollout


def test_production_backends_match_their_formula_on_a_plain_engines_logits(
    s1_run: dict[str, Any],
) -> None:
    from logprob_drift_operators.selected_logprob.chunked import chunked_selected_logprob
    from logprob_drift_operators.selected_logprob.reference import reference_selected_logprob

    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    checkpoint = resolve_checkpoint(s1_run["identity"]["checkpoint"]["uri"], expected_digest=None)
    llm = _plain_engine(checkpoint.path, "float32", int(s1_run["identity"]["sampling"]["seed"]))
    try:
        for backend, formula in (
            (REFERENCE, reference_selected_logprob),
            (CHUNKED, chunked_selected_logprob),
        ):
            attempt = s1_run["attempts"][f"logp.backend={backend}"]
            rows, sealed, rollout = _sealed_rows(attempt, "score_rollout.pt")
            captures = _prompt_path_captures(llm, rows)
            active = rollout["active_mask"].bool()
            worst = 0.0
            for i, (row, (_hidden, logits, _w)) in enumerate(zip(rows, captures, strict=True)):
                ids = torch.tensor(row[1:], dtype=torch.long)
                expected = formula(logits, ids)  # position t scores token t + 1
                start = int(rollout["attention_mask"][i].nonzero()[0])
                for t in active[i].nonzero().flatten().tolist():
                    got = float(sealed[i, t])
                    worst = max(worst, abs(got - float(expected[t - start - 1])))
            assert worst < 1e-5, (backend, worst)
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm


def test_the_float32_head_is_read_back_and_matches_one_computed_here(
    s1_run: dict[str, Any], bf16_engine: Any
) -> None:
    cases = s1_run["attempts"]
    for label, model_dtype in ((HEAD, "float32"), (PAIR, "bfloat16")):
        actual = _actual(cases[label])
        record = actual["knobs"]["rollout.lm_head_dtype"]
        assert (record["status"], record["actual"]) == ("applied", "float32"), record
        read_back = actual["read_back"]
        assert read_back["vllm.sampler_logits_dtype"] == "float32"
        assert read_back["vllm.lm_head_compute_dtype"] == "float32"
        assert read_back["vllm.lm_head_dtype"] == read_back["vllm.dtype"] == model_dtype
    bf16 = _actual(cases["rollout.dtype=bfloat16"])
    assert bf16["knobs"]["rollout.lm_head_dtype"]["actual"] == "compute"
    assert bf16["read_back"]["vllm.sampler_logits_dtype"] == "bfloat16"

    rows, prefill, rollout = _sealed_rows(cases[PAIR], "score_rollout_prefill.pt")
    captures = _prompt_path_captures(bf16_engine, rows)
    active = rollout["active_mask"].bool()
    worst32 = worst16 = 0.0
    for i, (row, (hidden, logits16, weight)) in enumerate(zip(rows, captures, strict=True)):
        assert hidden.dtype == weight.dtype == logits16.dtype == torch.bfloat16
        ids = torch.tensor(row[1:], dtype=torch.long)
        head32 = torch.nn.functional.linear(hidden.float(), weight.float()).double()
        lp32 = head32.log_softmax(-1).gather(-1, ids[:, None])[:, 0]
        lp16 = logits16.double().log_softmax(-1).gather(-1, ids[:, None])[:, 0]
        start = int(rollout["attention_mask"][i].nonzero()[0])
        for t in active[i].nonzero().flatten().tolist():
            got = float(prefill[i, t])
            worst32 = max(worst32, abs(got - float(lp32[t - start - 1])))
            worst16 = max(worst16, abs(got - float(lp16[t - start - 1])))
    assert worst32 < 1e-5, worst32
    assert worst16 > 10 * max(worst32, 1e-6), (worst16, worst32)  # the check tells them apart

    entries = {c["label"]: c for c in s1_run["attribution"]["cases"]}
    assert "rollout" in entries[PAIR]["classification"], entries[PAIR]["classification"]
    assert "training" not in entries[PAIR]["classification"]


def test_an_independent_vllm_engine_replays_the_bf16_rollout_the_same(
    s1_run: dict[str, Any], bf16_engine: Any
) -> None:
    """The bf16 rollout's sealed prefill replay is exactly what the plain engine gives: the
    sealed sequences resubmitted here in the run's chunks, ``prompt_logprobs=0``."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    attempt = s1_run["attempts"]["rollout.dtype=bfloat16"]
    rollout = _rollout(attempt)
    sealed = _rollout(attempt, "score_rollout_prefill.pt")["logprobs"]
    chunk = json.loads(S1.read_text())["baseline"]["batch"]["size"]
    lengths = rollout["attention_mask"].sum(-1).tolist()
    rows = [rollout["token_ids"][i, :n].tolist() for i, n in enumerate(lengths)]
    assert len(rows) > chunk - 1  # at least one whole chunk
    mine = torch.zeros_like(sealed)
    for start in range(0, len(rows), chunk):
        outputs = bf16_engine.generate(
            [TokensPrompt(prompt_token_ids=r) for r in rows[start : start + chunk]],
            SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0),
            use_tqdm=False,
        )
        for j, out in enumerate(outputs):
            row = start + j
            for k in range(1, len(rows[row])):
                mine[row, k] = out.prompt_logprobs[k][rows[row][k]].logprob
    active = rollout["active_mask"].bool()
    assert int(active.sum()) > 0
    mine = torch.where(active, mine, torch.zeros_like(mine))
    torch.testing.assert_close(sealed, mine, rtol=0, atol=0)
