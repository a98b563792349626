"""The pytest plugin under hostile input (issue 14, classes 1, 3, 6 and 7).

A config that cannot be planned is a one-line collection error (no traceback, escapes shown
escaped) and exits 2, with ``-n 2`` too; two configs with one ``experiment_id`` and a
``--drift-expect`` selector that matches no case are usage errors before anything runs;
``--drift-seal-key-env`` seals attempts with a key; an artifacts path that is a file fails
the items with one line.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest
from drift_testing import S0

pytest_plugins = ["pytester"]

CONFIG = "cross_config_s0_cpu_smoke.json"
RUN = ("--drift-config", CONFIG, "--drift-runtime", "cpu-smoke", "--drift-allow-smoke-operators")
EXPECT = ("--drift-expect", "logp.backend=smoke_only.logp_offset=MISMATCH")


@pytest.fixture(scope="module", autouse=True)
def _torch_loaded_once() -> None:
    pytest.importorskip("torch")


@pytest.fixture
def s0(pytester: pytest.Pytester) -> pytest.Pytester:
    shutil.copy(S0, pytester.path / CONFIG)
    return pytester


def document() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(S0.read_text())
    return loaded


def write(pytester: pytest.Pytester, name: str, doc: dict[str, Any]) -> None:
    (pytester.path / name).write_text(json.dumps(doc), encoding="utf-8")


def text(result: pytest.RunResult) -> str:
    return result.stdout.str() + result.stderr.str()


def test_a_config_with_escapes_is_a_one_line_collection_error(s0: pytest.Pytester) -> None:
    doc = document()
    doc["baseline"]["rollout"]["dty\npe\x1b[31m"] = "float32"
    doc["baseline"]["rollout"]["\u202eevil"] = "float32"
    write(s0, CONFIG, doc)
    result = s0.runpytest(*RUN)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    output = text(result)
    assert "Traceback" not in output and "\x1b" not in output
    lines = [line for line in result.outlines if "$.baseline.rollout[" in line]
    assert lines and '["dty\\npe\\x1b[31m"]' in lines[0]
    assert '["\\u202eevil"]' in lines[0]  # every fault, on the same line


@pytest.mark.slow
def test_a_collection_error_under_xdist_exits_2(s0: pytest.Pytester) -> None:
    doc = document()
    doc["identity"]["prompts"]["token_ids"] = [[64]]  # outside the synthetic vocabulary
    write(s0, CONFIG, doc)
    result = s0.runpytest_subprocess(*RUN, "-n", "2", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.INTERRUPTED, text(result)
    assert "$.identity.prompts.token_ids[0][0]" in text(result)
    assert "Traceback" not in text(result)


def test_two_configs_with_one_experiment_id_are_refused(s0: pytest.Pytester) -> None:
    doc = document()
    doc["description"] = "the same id, another definition"
    write(s0, "other.json", doc)
    result = s0.runpytest(*RUN, "--drift-config", "other.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "experiment_id 's0-cpu-smoke' is also the experiment_id of" in text(result)
    assert not (s0.path / "runs").exists()


@pytest.mark.parametrize("xdist", [(), ("-n", "2")])
def test_a_drift_expect_that_selects_no_case_is_a_usage_error(
    s0: pytest.Pytester, xdist: tuple[str, ...]
) -> None:
    result = s0.runpytest_subprocess(
        *RUN, *xdist, "--drift-expect", "batch.size=3=PASS", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text(result)
    assert "--drift-expect batch.size=3=PASS: selector 'batch.size=3' matches no planned case" in (
        text(result)
    )
    assert "Traceback" not in text(result)
    assert not (s0.path / "runs").exists()


def test_the_seal_key_option_seals_with_the_key(
    s0: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRIFT_TEST_KEY", "s" * 32)
    result = s0.runpytest(*RUN, *EXPECT, "--drift-seal-key-env", "DRIFT_TEST_KEY")
    assert result.ret == 0, text(result)
    completes = list((s0.path / "runs").glob("s0-cpu-smoke/cases/*/*/COMPLETE"))
    assert len(completes) == 3
    assert all(json.loads(p.read_text())["mac"]["algorithm"] == "hmac-sha256" for p in completes)
    monkeypatch.delenv("DRIFT_TEST_KEY")
    result = s0.runpytest(*RUN, *EXPECT, "--drift-seal-key-env", "DRIFT_TEST_KEY")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "DRIFT_TEST_KEY: the environment variable is not set" in text(result)


def test_artifacts_naming_a_file_fails_each_item_with_one_line(s0: pytest.Pytester) -> None:
    (s0.path / "afile").write_text("x")
    result = s0.runpytest(*RUN, *EXPECT, "--drift-artifacts", "afile")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "Traceback" not in text(result)
    failures = [line for line in result.outlines if "cannot hold runs" in line]
    assert failures and all("not a directory" in line for line in failures)
