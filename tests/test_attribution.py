"""Attribution: alignment properties, structural truths on the smoke runtime, a planted effect,
the sealed artifact's reuse and tamper detection, and verdicts that attribution never changes.

The real-engine structural truths (transformers, vLLM) are in tests/runtimes (slow).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import S0, make_runner, run_by_label
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.attribution.align import align, movement
from pytest_logprob_drift.attribution.analysis import NO_EFFECT
from pytest_logprob_drift.attribution.document import document_json
from pytest_logprob_drift.attribution.effect import drift_effect
from pytest_logprob_drift.attribution.sealed import (
    attribute_and_seal,
    attribution_dirs,
    verify_attribution,
)
from pytest_logprob_drift.cli import main
from pytest_logprob_drift.execute.runner import CaseResult
from pytest_logprob_drift.records import Lifecycle, MaskPolicy, frozen_mapping
from pytest_logprob_drift.registry.catalog import (
    SELECTED_LOGPROB,
    FactoryStyle,
    OperatorDescriptor,
)
from pytest_logprob_drift.runtimes.batch import canonical_batch

pytest_plugins = ["pytester"]

PAD, EOS = 0, 1

# ---- alignment properties ---------------------------------------------------------------------

responses = st.lists(st.integers(min_value=2, max_value=6), min_size=0, max_size=8)


def batch(
    prompts: list[list[int]],
    outs: list[list[int]],
    lp: float,
    policy: MaskPolicy = MaskPolicy.RESPONSE_THROUGH_EOS,
) -> dict[str, torch.Tensor]:
    return canonical_batch(
        prompts,
        [(o, [lp - 0.01 * j for j in range(len(o))]) for o in outs],
        PAD,
        eos_token_id=EOS,
        mask_policy=policy,
    )


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    samples=st.integers(min_value=1, max_value=4),
    policy=st.sampled_from(list(MaskPolicy)),
)
def test_alignment_never_pairs_different_tokens(
    data: st.DataObject, samples: int, policy: MaskPolicy
) -> None:
    prompts = [
        data.draw(st.lists(st.integers(2, 6), min_size=1, max_size=3)) for _ in range(samples)
    ]

    def draw_responses() -> list[list[int]]:
        outs = []
        for _ in range(samples):
            body = data.draw(responses)
            if data.draw(st.booleans()):
                body = [*body, EOS]
            outs.append(body or [EOS])
        return outs

    case_outs, ref_outs = draw_responses(), draw_responses()
    case, ref = batch(prompts, case_outs, -1.0, policy), batch(prompts, ref_outs, -2.0, policy)
    alignment = align(case, ref)
    width = alignment.mask.shape[1]
    for i, offsets in enumerate(alignment.offsets):
        positions = alignment.mask[i].nonzero().flatten()
        assert all(
            int(p) < case["token_ids"].shape[1] and int(p) < ref["token_ids"].shape[1]
            for p in positions
        )
        assert torch.equal(case["token_ids"][i, positions], ref["token_ids"][i, positions])
        assert bool(case["active_mask"][i, positions].all())
        assert bool(ref["active_mask"][i, positions].all())
        common = 0
        while (
            common < min(len(case_outs[i]), len(ref_outs[i]))
            and case_outs[i][common] == ref_outs[i][common]
        ):
            common += 1
        identical = case_outs[i] == ref_outs[i]
        assert alignment.first_divergence[i] == (None if identical else common)
        assert all(0 <= int(o) < common or identical for o in offsets)
        assert int(alignment.mask[i].sum()) <= width
    moved = movement(alignment, case["logprobs"], ref["logprobs"])
    assert moved.shared_tokens == alignment.shared_tokens
    if moved.shared_tokens:
        assert moved.max_abs_delta == pytest.approx(1.0)
        assert moved.bitwise_equal_fraction == 0.0
    else:
        assert (moved.max_abs_delta, moved.first_moved_offset) == (0.0, None)


def test_zero_shared_tokens_when_the_first_token_differs() -> None:
    case = batch([[3, 4]], [[5, 6, EOS]], -1.0)
    ref = batch([[3, 4]], [[6, 6, EOS]], -1.0)
    alignment = align(case, ref)
    assert alignment.shared_tokens == 0 and alignment.first_divergence == (0,)
    assert movement(alignment, case["logprobs"], ref["logprobs"]).shared_tokens == 0


def test_identical_executions_are_bitwise_equal() -> None:
    case = batch([[3], [4, 5]], [[2, 2, EOS], [6]], -1.0)
    alignment = align(case, case)
    assert alignment.earliest_divergence is None
    moved = movement(alignment, case["logprobs"], case["logprobs"])
    assert moved.bitwise_equal and moved.bitwise_equal_fraction == 1.0
    assert moved.shared_tokens == 4


def test_effect_interval_brackets_the_point_estimate_and_excludes_one_for_a_shift() -> None:
    generator = torch.Generator().manual_seed(0)
    ref = [torch.rand(50, generator=generator, dtype=torch.float64) * 1e-3 for _ in range(16)]
    same = drift_effect(ref, ref)
    assert same.mean.value == 1.0 and not same.mean.excludes_one
    doubled = drift_effect([r * 2 for r in ref], ref)
    assert doubled.mean.value == pytest.approx(2.0)
    assert doubled.mean.low is not None and doubled.mean.high is not None
    assert doubled.mean.low <= 2.0 <= doubled.mean.high
    zero = drift_effect(ref, [torch.zeros(50, dtype=torch.float64) for _ in ref])
    assert zero.mean.value is None and not zero.mean.excludes_one


# ---- structural truths on the smoke runtime ------------------------------------------------------


def s0_document(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(S0.read_text())
    document["baseline"]["logp"]["backend"] = "native"
    document["identity"]["sampling"]["max_new_tokens"] = 24
    document["interventions"] = [
        {"path": "batch.size", "values": [1]},
        {"path": "rollout.dtype", "values": ["bfloat16"]},
        {"path": "training.compute_dtype", "values": ["bfloat16"]},
    ]
    document.update(changes)
    return document


def run(
    work: Path, document: dict[str, Any], *, repeats: int = 1, **runner_args: Any
) -> list[CaseResult]:
    work.mkdir(parents=True, exist_ok=True)
    config = work / "config.json"
    config.write_text(json.dumps(document))
    plan = plan_file(str(config))
    with make_runner(
        plan, runtime="cpu-smoke", artifacts=work / "runs", baseline_repeats=repeats, **runner_args
    ) as runner:
        return runner.run()


def attribution_of(work: Path, results: list[CaseResult]) -> dict[str, Any]:
    baseline = next(r for r in results if r.label == "baseline")
    assert baseline.attempt_dir is not None
    sealed = attribute_and_seal(
        work / "runs" / "s0-cpu-smoke",
        "s0-cpu-smoke",
        baseline.attempt_dir,
        baseline.repeat_dirs,
        [r.attempt_dir for r in results if r is not baseline and r.attempt_dir is not None],
    )
    data: dict[str, Any] = document_json(sealed.document)
    return data


def test_knobs_move_only_their_own_side(work: Path) -> None:
    results = run(work, s0_document(), repeats=2)
    document = attribution_of(work, results)
    by_label = {c["label"]: c for c in document["cases"]}
    assert document["noise_floor"] == {
        "measured": True,
        "repeats": 1,
        "rollout_max_abs_delta": 0.0,
        "training_max_abs_delta": 0.0,
    }
    no_op = by_label["batch.size=1"]
    assert no_op["classification"] == NO_EFFECT
    assert no_op["rollout"]["bitwise_equal_fraction"] == 1.0
    assert no_op["training"]["bitwise_equal_fraction"] == 1.0
    training = by_label["training.compute_dtype=bfloat16"]
    assert training["rollout"]["max_abs_delta"] == 0.0  # the rollout side never moved
    assert training["training"]["max_abs_delta"] > 0.0
    assert training["earliest_divergence"] is None  # same sampled tokens
    assert training["classification"].startswith("moved the training side")
    rollout = by_label["rollout.dtype=bfloat16"]
    assert rollout["training"]["max_abs_delta"] == 0.0 or rollout["earliest_divergence"] is not None
    assert (
        "rollout" in rollout["classification"]
        or "changed the sampled tokens" in rollout["classification"]
    )
    # the knob that matters ranks above the one that does nothing
    assert document["ranking"][-1] == "batch.size=1"
    assert training["effect"]["mean_ratio"]["excludes_one"]


def test_a_rollout_change_of_tokens_is_aligned_only_on_the_shared_prefix(work: Path) -> None:
    # Different sampled tokens with everything else equal (the seed is identity, not a knob):
    # compare two sealed executions directly.
    first = run(work / "a", s0_document(interventions=[]))
    document = s0_document(interventions=[])
    document["identity"]["sampling"]["seed"] = 4321
    second = run(work / "b", document)
    assert first[0].attempt_dir is not None and second[0].attempt_dir is not None
    case = torch.load(second[0].attempt_dir / "score_rollout.pt", weights_only=True)
    ref = torch.load(first[0].attempt_dir / "score_rollout.pt", weights_only=True)
    alignment = align(case, ref)
    assert alignment.earliest_divergence is not None
    for i, first_divergence in enumerate(alignment.first_divergence):
        if first_divergence is not None:
            assert all(int(o) < first_divergence for o in alignment.offsets[i])


def shift_after_position(*, target: str, options: dict[str, Any]) -> Any:
    """A selected-logprob builder that moves training-side logprobs by ``shift`` at token
    positions >= ``position`` (teacher-forced logits column j scores token j + 1)."""
    shift, position = float(options["shift"]), int(options["position"])

    def kernel(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        scores = torch.log_softmax(logits.float(), -1).gather(-1, token_ids.unsqueeze(-1))
        scores = scores.squeeze(-1)
        if target == "training":
            columns = torch.arange(scores.shape[-1]) + 1
            scores = scores - shift * (columns >= position).to(scores.dtype)
        return scores

    return kernel


PLANTED = OperatorDescriptor(
    operation=SELECTED_LOGPROB,
    backend_id="test.planted_shift",
    target_tags=("rollout", "training"),
    devices=("cpu",),
    dtypes=("float32", "bfloat16", "float16"),
    required_topology=frozen_mapping({}),
    alignment_properties=(),
    lifecycle=Lifecycle.ENGINE_CONSTRUCTION,
    factory="test_attribution:shift_after_position",
    version="1",
    build_fingerprint="1",
    factory_style=FactoryStyle.BUILDER,
)


def test_a_planted_training_shift_is_attributed_to_the_training_side_from_its_position(
    work: Path,
) -> None:
    from pytest_logprob_drift.policy import assemble

    shift, position = 0.25, 9  # absolute token position; prompts are 2 to 5 tokens long
    catalog = assemble().operators.with_descriptors([PLANTED])
    # The backend takes options, so both executions bind it through an explicit mapping.
    reference = s0_document(interventions=[])
    del reference["baseline"]["logp"]
    reference["operators"] = {
        "selected_logprob": {
            "rollout": "rlkernel.reference_logp",
            "training": "rlkernel.reference_logp",
        }
    }
    planted = copy.deepcopy(reference)
    planted["operators"]["selected_logprob"]["training"] = {
        "backend": "test.planted_shift",
        "options": {"shift": shift, "position": position},
    }
    results = {}
    for name, doc in (("base", reference), ("planted", planted)):
        path = work / f"{name}.json"
        path.write_text(json.dumps(doc))
        results[name] = run_by_label(
            plan_file(str(path), catalog=catalog),
            runtime="cpu-smoke",
            artifacts=work / name,
            catalog=catalog,
        )
    base, shifted = results["base"]["baseline"], results["planted"]["baseline"]
    assert base.attempt_dir is not None and shifted.attempt_dir is not None
    sealed = attribute_and_seal(
        work / "planted" / "s0-cpu-smoke",
        "s0-cpu-smoke",
        base.attempt_dir,
        (),
        [shifted.attempt_dir],
    )
    entry = sealed.document.cases[0]
    assert entry.rollout.max_abs_delta == 0.0
    assert entry.training.max_abs_delta == pytest.approx(shift, abs=1e-6)
    rollout = torch.load(base.attempt_dir / "score_rollout.pt", weights_only=True)
    starts = rollout["prompt_lengths"]
    expected_offset = min(max(position - int(s), 0) for s in starts)
    assert entry.training.first_moved_offset == expected_offset
    assert entry.classification == f"moved the training side from position {expected_offset}"


# ---- the sealed artifact -------------------------------------------------------------------


def cli_run(work: Path, *extra: str) -> int:
    return main(
        [
            "run",
            str(S0),
            "--runtime",
            "cpu-smoke",
            "--allow-smoke-operators",
            "--artifacts",
            str(work / "runs"),
            "--expect",
            "logp.backend=smoke_only.logp_offset=MISMATCH",
            *extra,
        ]
    )


def test_rerun_reuses_the_sealed_attribution_and_verify_recomputes_it(
    work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_run(work, "--baseline-repeats", "2") == 0
    first = capsys.readouterr().out
    assert "drift attribution (sealed:" in first
    assert "moved the training side" in first and "no effect" in first
    run_dir = work / "runs" / "s0-cpu-smoke"
    assert len(attribution_dirs(run_dir)) == 1
    assert cli_run(work, "--baseline-repeats", "2") == 0
    assert "drift attribution (reused:" in capsys.readouterr().out
    assert len(attribution_dirs(run_dir)) == 1
    assert verify_attribution(run_dir, attribution_dirs(run_dir)[0]) == []
    assert main(["verify", str(run_dir)]) == 0
    assert "ok (recomputed, identical)" in capsys.readouterr().out


def test_verify_catches_a_tampered_attribution(
    work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_run(work) == 0
    run_dir = work / "runs" / "s0-cpu-smoke"
    directory = attribution_dirs(run_dir)[0]
    path = directory / "attribution.json"
    path.chmod(0o644)
    path.write_text(path.read_text().replace("moved the training side", "no effect at all"))
    capsys.readouterr()
    assert main(["verify", str(run_dir)]) == 1
    out = capsys.readouterr().out
    assert f"attribution {directory.name}: invalid: attribution.json: SHA-256 does not match" in out


def test_verify_catches_a_forged_but_resealed_attribution(work: Path) -> None:
    assert cli_run(work) == 0
    run_dir = work / "runs" / "s0-cpu-smoke"
    directory = attribution_dirs(run_dir)[0]
    document = json.loads((directory / "attribution.json").read_text())
    document["cases"][0]["training"]["max_abs_delta"] = 0.5
    forged = json.dumps(document, indent=2, sort_keys=True) + "\n"
    (directory / "attribution.json").write_text(forged)
    seal = json.loads((directory / "COMPLETE").read_text())
    import hashlib

    seal["files"]["attribution.json"] = hashlib.sha256(forged.encode()).hexdigest()
    (directory / "COMPLETE").write_text(json.dumps(seal))
    problems = verify_attribution(run_dir, directory)
    assert problems and "max_abs_delta: recorded 0.5" in problems[0]


def test_verify_catches_a_changed_baseline_attempt(work: Path) -> None:
    assert cli_run(work) == 0
    run_dir = work / "runs" / "s0-cpu-smoke"
    document = json.loads((attribution_dirs(run_dir)[0] / "attribution.json").read_text())
    baseline = document["baseline"]
    complete = run_dir / "cases" / baseline["case_id"] / baseline["attempt_id"] / "COMPLETE"
    complete.write_text(complete.read_text() + " ")
    problems = verify_attribution(run_dir, attribution_dirs(run_dir)[0])
    assert problems and "is no longer the one it was computed from" in problems[0]


def test_outcomes_are_identical_with_and_without_attribution(work: Path) -> None:
    plain = run(work / "plain", s0_document())
    repeated = run(work / "repeated", s0_document(), repeats=3)
    assert [(r.label, r.outcome, r.comparison.mismatches) for r in plain] == [
        (r.label, r.outcome, r.comparison.mismatches) for r in repeated
    ]
    baseline = next(r for r in repeated if r.label == "baseline")
    assert len(baseline.repeat_dirs) == 2
    for attempt in baseline.repeat_dirs:  # every repeat is a sealed attempt of the same case
        assert (attempt / "COMPLETE").is_file()
        assert attempt.parent == baseline.attempt_dir.parent  # type: ignore[union-attr]
    attribution_of(work / "repeated", repeated)
    for result in repeated:  # sealing the attribution touched no attempt
        assert result.attempt_dir is not None
        assert (
            json.loads((result.attempt_dir / "comparison.json").read_text())["outcome"]
            == result.outcome.value
        )


# ---- the pytest plugin ------------------------------------------------------------------------


def test_plugin_summary_junit_properties_and_sealed_attribution(pytester: pytest.Pytester) -> None:
    pytester.path.joinpath("exp.json").write_text(S0.read_text())
    result = pytester.runpytest(
        "--drift-config",
        "exp.json",
        "--drift-runtime",
        "cpu-smoke",
        "--drift-allow-smoke-operators",
        "--drift-baseline-repeats",
        "2",
        "--drift-expect",
        "logp.backend=smoke_only.logp_offset=MISMATCH",
        "--junitxml",
        "junit.xml",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "*= drift attribution =*",
            "exp.json::s0-cpu-smoke (against its baseline):",
            "logp.backend=smoke_only.logp_offset*moved the training side*excludes 1",
            "batch.size=1*no effect (bitwise identical on both sides)*",
            "ranked by effect on the drift: logp.backend=smoke_only.logp_offset",
            "within the contract (PASS, max |diff| below 0.1 of the threshold; not ranked): "
            "batch.size=1",
            "sealed attribution: *attributions*",
        ]
    )
    junit = (pytester.path / "junit.xml").read_text()
    assert 'name="drift_attribution" value="moved the training side from position 0"' in junit
    assert 'name="drift_attribution" value="no effect (bitwise identical on both sides)"' in junit
    run_dir = pytester.path / "runs" / "s0-cpu-smoke"
    assert len(attribution_dirs(run_dir)) == 1
    assert verify_attribution(run_dir, attribution_dirs(run_dir)[0]) == []


def test_plugin_refuses_a_bad_repeat_count(pytester: pytest.Pytester) -> None:
    pytester.path.joinpath("exp.json").write_text(S0.read_text())
    result = pytester.runpytest(
        "--drift-config",
        "exp.json",
        "--drift-runtime",
        "cpu-smoke",
        "--drift-baseline-repeats",
        "0",
        "-p",
        "no:cacheprovider",
    )
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--drift-baseline-repeats '0': expected a positive integer*"])


@given(
    st.lists(st.floats(min_value=0, max_value=1e3, allow_nan=False), min_size=1, max_size=300),
    st.sampled_from([0.5, 0.9, 0.99, 1.0]),
)
def test_exact_quantile_is_torchs_linear_quantile(values: list[float], q: float) -> None:
    from pytest_logprob_drift.attribution.effect import _exact_quantile

    tensor = torch.tensor(values, dtype=torch.float64)
    assert _exact_quantile(tensor, q) == pytest.approx(
        float(torch.quantile(tensor, q)), rel=1e-12, abs=1e-12
    )


@given(
    st.lists(
        st.lists(st.floats(min_value=0, max_value=1e3, allow_nan=False), max_size=40),
        min_size=1,
        max_size=24,
    ),
)
def test_the_resampled_p99_is_the_one_over_every_bin(samples: list[list[float]]) -> None:
    """Each bootstrap resample's binned p99 (read only from the bins some sample fills) is the
    upper edge of the bin where the resample's cumulative count over all bins first reaches 99%
    of its total, computed here with numpy in float64; an empty resample reads the first bin."""
    import numpy as np

    from pytest_logprob_drift.attribution.effect import _edges, _weights, prepare

    rows = [torch.tensor(s, dtype=torch.float64) for s in samples]
    edges = _edges().numpy()
    bins = edges.size + 1
    histograms = np.zeros((len(rows), bins))
    for i, values in enumerate(samples):  # torch.bucketize's default: the first edge >= value
        np.add.at(histograms[i], np.searchsorted(edges, np.array(values), side="left"), 1)
    cumulative = np.cumsum(_weights(len(rows)).numpy() @ histograms, axis=1)
    upper = np.append(edges, edges[-1])
    expected = []
    for row in cumulative:
        # The resampled counts are integers below 2**24, exact in float32; the 99% target is
        # one float32 product, as the library forms it (IEEE: the same on every CPU).
        target = float(np.float32(row[-1]) * np.float32(0.99))
        index = 0 if row[-1] == 0 else int(np.argmax(row >= target))
        expected.append(upper[min(index, edges.size)])
    assert prepare(rows).p99s.tolist() == expected
