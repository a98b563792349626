"""The pytest plugin, through real pytest runs (pytester) on the cpu-smoke runtime.

Each test runs pytest over a copy of ``experiments/cross_config_s0_cpu_smoke.json`` (or a
config derived from it) in a temporary directory. Runs are in-process unless isolation matters:
the torch-not-imported check and pytest-xdist use a subprocess.
"""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from drift_testing import ROOT, S0, S2

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.execute.protocol import bind_case

pytest_plugins = ["pytester"]


TEMPLATE = ROOT / "conftest_templates" / "operator_workstream" / "conftest.py"
CONFIG = "cross_config_s0_cpu_smoke.json"
RUN = ("--drift-config", CONFIG, "--drift-runtime", "cpu-smoke", "--drift-allow-smoke-operators")
OFFSET = "logp.backend=smoke_only.logp_offset"
NODE = f"{CONFIG}::s0-cpu-smoke"
SERIAL_VERDICTS = {
    f"{NODE}::baseline": "PASS",
    f"{NODE}::batch.size=1": "PASS",
    f"{NODE}::{OFFSET}": "MISMATCH",
}


@pytest.fixture(scope="module", autouse=True)
def _torch_loaded_once() -> None:
    """In-process runs restore ``sys.modules`` afterwards, and torch cannot be imported twice
    in one process: load it (and the execution modules) before any run snapshots."""
    pytest.importorskip("torch")


@pytest.fixture
def s0(pytester: pytest.Pytester) -> pytest.Pytester:
    shutil.copy(S0, pytester.path / CONFIG)
    return pytester


def verdicts(result: pytest.RunResult) -> dict[str, str]:
    """``node id -> status word`` from the ``-rA`` short summary (xdist group suffix cut)."""
    found: dict[str, str] = {}
    for line in result.outlines:
        match = re.match(r"^(PASS|MISMATCH|PLAN_ONLY|FAILED|PASSED|SKIPPED) (\S+)", line)
        if match and "::" in match.group(2):
            found[match.group(2).split("@", 1)[0]] = match.group(1)
    return found


def attempt_dirs(artifacts: Path) -> set[Path]:
    return {p for p in artifacts.glob("*/cases/*/*") if p.is_dir()}


def no_traceback(result: pytest.RunResult) -> None:
    text = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in text
    assert "raise " not in text
    assert "items.py" not in text


def worst_token_line(artifacts: Path) -> str:
    """The failure text's first worst-token row, as a glob, derived from the sealed evidence of
    the one MISMATCH attempt: which token is worst depends on the CPU's float rounding."""
    comparisons = [json.loads(p.read_text()) for p in artifacts.glob("*/cases/*/*/comparison.json")]
    mismatch = [c for c in comparisons if c["outcome"] == "MISMATCH"]
    assert len(mismatch) == 1
    w = mismatch[0]["worst_tokens"][0]
    return (
        f"* {w['sample']} * {w['position']} * {w['rollout_logprob']:.6f} * "
        f"{w['training_logprob']:.6f} * {w['abs_diff']:.3e}"
    )


# ---- items, outcomes, summary ---------------------------------------------------------------


def test_one_item_per_case_outcomes_summary_and_evidence(s0: pytest.Pytester) -> None:
    result = s0.runpytest(*RUN, "-rA")
    result.assert_outcomes(passed=2, failed=1)
    planned = [ec.case.label for ec in plan_file(str(S0)).cases]
    assert len(planned) == 3
    assert verdicts(result) == SERIAL_VERDICTS
    result.stdout.fnmatch_lines(
        [
            "*= logprob drift outcomes =*",
            "2 PASS, 1 MISMATCH",
            "engine constructions: rollout 2, training 2",
        ]
    )
    # the failure text is the evidence, not a traceback
    result.stdout.fnmatch_lines(
        [
            "MISMATCH (expected PASS): 38/38 active tokens differ by more than 0.001*",
            "threshold 0.001 (contract ws1.*); active tokens 38, mismatches 38",
            "worst tokens:  sample  position  rollout_logprob  training_logprob  |diff|",
            worst_token_line(s0.path / "runs"),
            "knobs: batch.size requested=4 actual=4 applied; logp.backend *",
            f"artifacts (new attempt): {s0.path / 'runs' / 's0-cpu-smoke' / 'cases'}/*",
        ]
    )
    no_traceback(result)


def test_expectation_makes_the_mismatch_pass(s0: pytest.Pytester) -> None:
    result = s0.runpytest(*RUN, "-v", "--drift-expect", f"{OFFSET}=MISMATCH")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines([f"*::{OFFSET} MISMATCH (expected)*", "2 PASS, 1 MISMATCH"])


@pytest.mark.parametrize(
    ("args", "label"),
    [
        (("-k", "batch.size=1"), "batch.size=1"),
        (("-k", "baseline"), "baseline"),
        (("-m", "drift_knob_logp_backend"), OFFSET),
        ((f"{NODE}::batch.size=1",), "batch.size=1"),
    ],
)
def test_selection_picks_exactly_one_case(
    s0: pytest.Pytester, args: tuple[str, ...], label: str
) -> None:
    result = s0.runpytest(*RUN, "-rA", *args)
    assert list(verdicts(result)) == [f"{NODE}::{label}"]
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) + outcomes.get("failed", 0) == 1


def test_pairwise_labels_select_with_k(s0: pytest.Pytester) -> None:
    document = json.loads(S0.read_text())
    document["interventions"] = [
        {"path": "batch.size", "values": [1, 2]},
        {"path": "rollout.dtype", "values": ["bfloat16"]},
    ]
    document["pairs"] = [["batch.size", "rollout.dtype"]]
    (s0.path / CONFIG).write_text(json.dumps(document))
    result = s0.runpytest(
        "--drift-config",
        CONFIG,
        "--drift-pairwise",
        "--collect-only",
        "-q",
        "-k",
        "batch.size=1,rollout.dtype=bfloat16",
    )
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [f"{NODE}::batch.size=1,rollout.dtype=bfloat16", "1/6 tests collected (5 deselected)*"]
    )


def test_a_drift_config_without_paths_collects_only_its_cases(s0: pytest.Pytester) -> None:
    """From a repository root whose testpaths hold its own suite, ``--drift-config`` alone
    collects the drift cases only; a path on the command line is still collected beside them."""
    s0.makeini("[pytest]\ntestpaths = suite\n")
    s0.mkdir("suite")
    (s0.path / "suite" / "test_own.py").write_text("def test_own():\n    pass\n")
    result = s0.runpytest("--drift-config", CONFIG, "--collect-only", "-q")
    assert result.ret == 0
    assert not [line for line in result.outlines if "test_own" in line]
    result.stdout.fnmatch_lines([f"{NODE}::baseline", "3 tests collected*"])
    result = s0.runpytest("--drift-config", CONFIG, "--collect-only", "-q", "suite")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["suite/test_own.py::test_own", "4 tests collected*"])


@pytest.mark.process  # a fresh interpreter: sys.modules after collection
def test_collect_only_lists_cases_without_importing_torch(s0: pytest.Pytester) -> None:
    s0.makeconftest("""
        import sys

        def pytest_collection_finish(session):
            with open("torch_imported.txt", "w") as out:
                out.write(str("torch" in sys.modules))
    """)
    result = s0.runpytest_subprocess(*RUN, "--collect-only", "-q")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [f"{NODE}::baseline", f"{NODE}::batch.size=1", f"{NODE}::{OFFSET}", "3 tests collected*"]
    )
    assert (s0.path / "torch_imported.txt").read_text() == "False"


@pytest.mark.slow
def test_xdist_loadgroup_gives_the_same_verdicts(s0: pytest.Pytester) -> None:
    result = s0.runpytest_subprocess(*RUN, "-rA", "-n", "2", "--dist", "loadgroup")
    result.assert_outcomes(passed=2, failed=1)
    assert verdicts(result) == SERIAL_VERDICTS
    # one process fingerprint -> one xdist group -> one worker builds each engine once
    result.stdout.fnmatch_lines(
        ["2 PASS, 1 MISMATCH", "engine constructions: rollout 2, training 2"]
    )
    assert len(set(re.findall(r"::\S+@(drift-[0-9a-f]{16})", result.stdout.str()))) == 1
    assert len(list((s0.path / "runs").glob("s0-cpu-smoke/cases/*/*/COMPLETE"))) == 3


# ---- resume ---------------------------------------------------------------------------------


def test_rerun_reuses_every_sealed_attempt(s0: pytest.Pytester) -> None:
    first = s0.runpytest(*RUN, "--drift-artifacts", "art")
    first.assert_outcomes(passed=2, failed=1)
    before = attempt_dirs(s0.path / "art")
    assert len(before) == 3
    second = s0.runpytest(*RUN, "--drift-artifacts", "art", "--junitxml", "rerun.xml")
    second.assert_outcomes(passed=2, failed=1)
    assert attempt_dirs(s0.path / "art") == before
    second.stdout.fnmatch_lines(
        ["artifacts (reused sealed attempt): *", "engine constructions: rollout 0, training 0"]
    )
    root = ET.parse(s0.path / "rerun.xml").getroot()
    reused = [p.get("value") for p in root.iter("property") if p.get("name") == "drift_reused"]
    assert reused == ["True", "True", "True"]


def test_last_failed_reruns_only_the_failed_case(s0: pytest.Pytester) -> None:
    s0.runpytest(*RUN).assert_outcomes(passed=2, failed=1)
    result = s0.runpytest(*RUN, "--lf", "-rA")
    result.assert_outcomes(failed=1, deselected=2)
    assert verdicts(result) == {f"{NODE}::{OFFSET}": "MISMATCH"}


# ---- errors ---------------------------------------------------------------------------------


CRASHING_SCORER = """
from pytest_logprob_drift.errors import RuntimeFailure
from pytest_logprob_drift.runtimes.smoke.runtime import StatelessScorer

original = StatelessScorer.score


def crash_at_batch_size_one(self, identity, rollout, *, batch_size, logp):
    if batch_size == 1:
        raise RuntimeFailure("scorer worker died: out of memory")
    return original(self, identity, rollout, batch_size=batch_size, logp=logp)


def pytest_configure(config):
    StatelessScorer.score = crash_at_batch_size_one


def pytest_unconfigure(config):
    StatelessScorer.score = original
"""


def test_a_runtime_failure_is_an_error_item_in_one_line(s0: pytest.Pytester) -> None:
    """The case whose engine fails is an error (E), not a verdict: one line naming the case and
    the runtime's message; nothing is sealed for it; the other cases still run and pass or
    fail on their verdicts; a rerun without the fault executes only that case."""
    s0.makeconftest(CRASHING_SCORER)
    result = s0.runpytest(*RUN, "-rA")
    result.assert_outcomes(passed=1, failed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of s0-cpu-smoke::batch.size=1 *",
            "batch.size=1: scorer worker died: out of memory",
            f"ERROR {NODE}::batch.size=1*",
        ]
    )
    no_traceback(result)
    cases = s0.path / "runs" / "s0-cpu-smoke" / "cases"
    sealed = {
        c.name for c in cases.iterdir() if any((a / "COMPLETE").exists() for a in c.iterdir())
    }
    assert len(sealed) == 2
    (s0.path / "conftest.py").unlink()
    result = s0.runpytest(*RUN, "-rA")
    assert verdicts(result) == SERIAL_VERDICTS
    assert len(list(cases.iterdir())) == 3


def test_unknown_knob_is_a_collection_error_naming_the_json_path(s0: pytest.Pytester) -> None:
    document = json.loads(S0.read_text())
    document["interventions"][0]["path"] = "batch.sizee"
    (s0.path / CONFIG).write_text(json.dumps(document))
    result = s0.runpytest(*RUN)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            f"*{CONFIG}: error UNKNOWN_KNOB at $.interventions[[]0].path:"
            " 'batch.sizee' is not an allowlisted knob*"
        ]
    )
    no_traceback(result)


def test_bad_json_is_a_collection_error_without_traceback(s0: pytest.Pytester) -> None:
    (s0.path / CONFIG).write_text('{"schema_version": "cross_config.experiment_config.v1",\n')
    result = s0.runpytest(*RUN)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*{CONFIG}: $: invalid JSON at line 2*"])
    no_traceback(result)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--drift-runtime", "warp-drive"), "*--drift-runtime 'warp-drive': unknown runtime*"),
        (("--drift-expect", "baseline"), "*--drift-expect 'baseline': expected SELECTOR=OUTCOME*"),
        (("--drift-expect", "baseline=GREAT"), "*unknown outcome 'GREAT'*"),
        (("--drift-config", "missing.json"), "*--drift-config */missing.json: file not found*"),
        (("--drift-config", CONFIG), "*--drift-config needs --drift-runtime NAME*"),
    ],
)
def test_bad_option_values_are_usage_errors(
    s0: pytest.Pytester, args: tuple[str, ...], message: str
) -> None:
    base = ("--drift-config", CONFIG, "--drift-runtime", "cpu-smoke")
    if args[0] == "--drift-config":
        base = ()
    result = s0.runpytest(*base, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


# ---- ini, plan-only, PLAN_ONLY, junitxml ----------------------------------------------------


def test_flag_overrides_ini_and_ini_config_list(s0: pytest.Pytester) -> None:
    shutil.copy(S2, s0.path / S2.name)
    s0.makeini(f"""
        [pytest]
        drift_runtime = warp-drive
        drift_allow_smoke_operators = true
        drift_config =
            {CONFIG}
            {S2.name}
    """)
    assert s0.runpytest().ret == pytest.ExitCode.USAGE_ERROR  # the ini value is validated
    result = s0.runpytest("--drift-runtime", "cpu-smoke", "-rA")
    result.assert_outcomes(passed=2, failed=1, skipped=6)
    result.stdout.fnmatch_lines(
        [
            "2 PASS, 1 MISMATCH, 6 PLAN_ONLY",
            f"PLAN_ONLY [6] {S2.name}:1: PLAN_ONLY: scenario S2 on cuda is plan-only for runtime "
            "'cpu-smoke' (it executes S0 on cpu)",
        ]
    )


def test_s2_config_on_cpu_smoke_is_plan_only(s0: pytest.Pytester) -> None:
    shutil.copy(S2, s0.path / S2.name)
    result = s0.runpytest("--drift-config", S2.name, "--drift-runtime", "cpu-smoke", "-rs")
    result.assert_outcomes(skipped=6)
    result.stdout.fnmatch_lines(["6 PLAN_ONLY", "*PLAN_ONLY: scenario S2 on cuda*"])
    assert not (s0.path / "runs").exists()


def test_plan_only_skips_every_case(s0: pytest.Pytester) -> None:
    result = s0.runpytest("--drift-config", CONFIG, "--drift-plan-only", "-rs")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines(["3 PLAN_ONLY", "*--drift-plan-only: case * planned, not executed"])
    assert not (s0.path / "runs").exists()


def test_junitxml_carries_the_verdict(s0: pytest.Pytester) -> None:
    s0.runpytest(*RUN, "--junitxml", "out.xml").assert_outcomes(passed=2, failed=1)
    root = ET.parse(s0.path / "out.xml").getroot()
    outcomes = {
        case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
        for case in root.iter("testcase")
    }
    assert {name: props["drift_outcome"] for name, props in outcomes.items()} == {
        "baseline": "PASS",
        "batch.size=1": "PASS",
        OFFSET: "MISMATCH",
    }
    offset = outcomes[OFFSET]
    assert offset["drift_threshold"] == "0.001"
    assert offset["drift_mismatches"] == "38"
    assert Path(offset["drift_attempt"]).is_dir()


# ---- engine lifecycle -----------------------------------------------------------------------

LIFECYCLE_CONFTEST = """
    import json

    import pytest

    from pytest_logprob_drift.plugin.items import DriftCaseItem
    from pytest_logprob_drift.plugin.session import drift_session


    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(item, nextitem):
        if isinstance(item, DriftCaseItem):
            pools = [r.pool for r in drift_session(item.config).runners.values()]
            with open("live_engines.jsonl", "a") as out:
                out.write(json.dumps({
                    "label": item.name,
                    "rollout": sorted(k for p in pools for k in p.rollout),
                    "training": sorted(k for p in pools for k in p.training)}) + "\\n")
"""


def oat_config() -> dict[str, Any]:
    document = json.loads(S0.read_text())
    document["experiment_id"] = "s0-oat-lifecycle"
    document["interventions"] = [
        {"path": "batch.size", "values": [1, 2]},
        {"path": "rollout.dtype", "values": ["bfloat16"]},
        {"path": "training.compute_dtype", "values": ["bfloat16"]},
        {"path": "logp.backend", "values": ["smoke_only.logp_offset"]},
    ]
    return document


def test_engines_built_once_per_fingerprint_and_torn_down_when_unneeded(
    pytester: pytest.Pytester,
) -> None:
    config = pytester.path / "oat.json"
    config.write_text(json.dumps(oat_config()))
    pytester.makeconftest(LIFECYCLE_CONFTEST)
    result = pytester.runpytest(
        "--drift-config",
        "oat.json",
        "--drift-runtime",
        "cpu-smoke",
        "--drift-allow-smoke-operators",
        "-p",
        "no:randomly",
    )
    plan = plan_file(str(config))
    bindings = {
        ec.case.label: bind_case(
            ec, runtime_kind="cpu-smoke", identity=plan.plan.identity, device="cpu"
        )
        for ec in plan.cases
    }
    rollout = {b.rollout_construction_fingerprint for b in bindings.values()}
    training = {b.training_construction_fingerprint for b in bindings.values()}
    assert len(bindings) == 6 and len(rollout) == 3 and len(training) == 3
    result.stdout.fnmatch_lines(
        [f"engine constructions: rollout {len(rollout)}, training {len(training)}"]
    )
    rows = [
        json.loads(line) for line in (pytester.path / "live_engines.jsonl").read_text().splitlines()
    ]
    assert sorted(r["label"] for r in rows) == sorted(bindings)
    for index, row in enumerate(rows):  # alive after an item = used before and needed after
        done, rest = rows[: index + 1], rows[index + 1 :]
        for side in ("rollout", "training"):

            def fingerprints(part: list[dict[str, Any]], side: str = side) -> set[str]:
                return {
                    getattr(bindings[r["label"]], f"{side}_construction_fingerprint") for r in part
                }

            assert set(row[side]) == fingerprints(done) & fingerprints(rest), row
    assert rows[-1]["rollout"] == rows[-1]["training"] == []


HOOK_CONFTEST = """
    def pytest_logprob_drift_operators(config):
        return [{"operation": "selected_logprob", "backend_id": "ws.hooked",
                 "target_tags": ["rollout", "training"], "devices": ["cpu"],
                 "dtypes": ["float32"], "required_topology": {},
                 "alignment_properties": [], "lifecycle": "engine_construction",
                 "factory": "ws_kernel_not_imported_at_collection:kernel",
                 "version": "1", "build_fingerprint": "b1", "test_only": SMOKE}]
"""


@pytest.mark.parametrize(("hook", "smoke"), [(False, False), (True, False), (True, True)])
def test_operator_hook_descriptors_are_bound_at_planning(
    s0: pytest.Pytester, hook: bool, smoke: bool
) -> None:
    document = json.loads(S0.read_text())
    document["baseline"]["logp"]["backend"] = "ws.hooked"
    document["interventions"] = document["interventions"][:1]
    (s0.path / CONFIG).write_text(json.dumps(document))
    if hook:
        s0.makeconftest(HOOK_CONFTEST.replace("SMOKE", str(smoke)))
    result = s0.runpytest("--drift-config", CONFIG, "--collect-only", "-q")
    if hook and not smoke:
        assert result.ret == 0
        result.stdout.fnmatch_lines([f"{NODE}::baseline", f"{NODE}::batch.size=1"])
    else:
        result.assert_outcomes(errors=1)
        result.stdout.fnmatch_lines(
            [
                "*test-only backends cannot be registered through pytest_logprob_drift_operators"
                if smoke
                else "*UNKNOWN_BACKEND at $.baseline.logp.backend: no selected_logprob "
                "backend 'ws.hooked' is registered*"
            ]
        )
        no_traceback(result)


# ---- operator workstream template -----------------------------------------------------------

WORKSTREAM_KERNEL = """
    import torch


    def selected_logprob(logits, token_ids):
        logprobs = torch.log_softmax(logits.double(), dim=-1)
        return logprobs.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1).float()
"""


def test_operator_workstream_template_works_as_copied(pytester: pytest.Pytester) -> None:
    shutil.copy(TEMPLATE, pytester.path / "conftest.py")
    pytester.makepyfile(workstream_kernel=WORKSTREAM_KERNEL)
    result = pytester.runpytest("--drift-runtime", "cpu-smoke", "-rA")
    result.assert_outcomes(passed=2)
    generated = "drift-configs/cross_config_s0_cpu_smoke.workstream.selected_logprob.json"
    experiment = "s0-cpu-smoke--workstream.selected_logprob"
    assert verdicts(result) == {
        f"{generated}::{experiment}::baseline": "PASS",
        f"{generated}::{experiment}::batch.size=1": "PASS",
    }
    actual = [
        json.loads(p.read_text())
        for p in (pytester.path / "runs").glob(f"{experiment}/cases/*/*/actual.json")
    ]
    assert len(actual) == 2
    for document in actual:
        sides = {p["target"]: (p["backend"], p["factory"]) for p in document["operator_provenance"]}
        assert sides == {
            "rollout": ("native", None),
            "training": ("workstream.selected_logprob", "workstream_kernel:selected_logprob"),
        }
        assert document["training_evidence"] is not None
