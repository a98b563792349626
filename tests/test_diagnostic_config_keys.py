"""Each diagnostic owns its config key ``$.diagnostics.<key>`` and its execution-key member
(issue 51 item 1): the loader and the execution key loop over the installed diagnostics'
``ConfigKey``s; the built-in ones give today's members, values and order; the test tree's
diagnostic declares a key of its own, accepted only while it is installed; planning with
every key reads the folders' config modules, never a diagnostic, torch or typing."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from drift_testing import S0, cli, experiment_config
from log_ratio_peak import DIAGNOSTIC
from log_ratio_peak.config import KEY

from pytest_logprob_drift import ConfigError, plan_file
from pytest_logprob_drift.diagnostics import registry
from pytest_logprob_drift.diagnostics.config_key import ConfigKey
from pytest_logprob_drift.execute.protocol import bind_case
from pytest_logprob_drift.execute.provenance import execution_key_payload
from pytest_logprob_drift.records import FullVocabularySpec, LayerSpec

EVERY_KEY = {
    "full_vocabulary": {"top_k": 3},
    "replay": True,
    "layers": {"positions_per_row": 2},
    "routing": True,
}


def _config(work: Path, diagnostics: object, name: str = "config.json") -> str:
    return str(experiment_config(work, S0, {"diagnostics": diagnostics}, file_name=name))


def _key_diagnostics(config: str) -> object:
    """The execution key's ``diagnostics`` member of the plan's first case (absent: None)."""
    planned = plan_file(config)
    plan, ec = planned.plan, planned.cases[0]
    binding = bind_case(
        ec,
        runtime_kind="cpu-smoke",
        identity=plan.identity,
        device=plan.scenario.device,
        diagnostics=plan.diagnostics,
    )
    payload = execution_key_payload(
        ec=ec,
        identity=plan.identity,
        materialized={},
        binding=binding,
        contract=plan.contract,
        environment={},
    )
    return payload.get("diagnostics")


@pytest.fixture
def peak_installed() -> Iterator[None]:
    registry.install(DIAGNOSTIC)
    try:
        yield
    finally:
        registry.uninstall(DIAGNOSTIC.name)


def test_the_built_in_keys_are_todays_in_todays_order() -> None:
    assert [k.key for k in registry.config_keys()] == [
        "full_vocabulary",
        "replay",
        "layers",
        "routing",
    ]
    assert all(isinstance(k, ConfigKey) for k in registry.config_keys())


def test_the_execution_key_members_are_todays(tmp_path: Path) -> None:
    """Values and order as the execution key had them before each diagnostic owned its key:
    the spec's canonical form, ``true``, ``{"positions_per_row": k}`` or ``true``."""
    member = _key_diagnostics(_config(tmp_path, EVERY_KEY))
    assert member == {
        "full_vocabulary": {"top_k": 3, "worst_positions": 5},
        "replay": True,
        "layers": {"positions_per_row": 2},
        "routing": True,
    }
    assert isinstance(member, dict)
    assert list(member) == ["full_vocabulary", "replay", "layers", "routing"]
    every = _key_diagnostics(_config(tmp_path, {"layers": True, "routing": False}, "b.json"))
    assert every == {"layers": True}
    off = {"full_vocabulary": False, "replay": False, "layers": False, "routing": False}
    assert _key_diagnostics(_config(tmp_path, off, "c.json")) is None


def test_the_plan_reads_the_asked_values_by_config_key(tmp_path: Path) -> None:
    plan = plan_file(_config(tmp_path, EVERY_KEY)).plan
    assert dict(plan.diagnostics) == {
        "full_vocabulary": FullVocabularySpec(top_k=3, worst_positions=5),
        "layers": LayerSpec(positions_per_row=2),
        "replay": True,
        "routing": True,
    }
    assert plan.full_vocabulary == FullVocabularySpec(top_k=3, worst_positions=5)
    assert plan.layers == LayerSpec(positions_per_row=2) and plan.replay and plan.routing


@pytest.mark.parametrize(
    ("value", "where", "what"),
    [
        ("yes", "$.diagnostics.replay", "expected a boolean, got string 'yes'"),
        (1, "$.diagnostics.routing", "expected a boolean, got integer 1"),
    ],
)
def test_a_switch_says_its_path(tmp_path: Path, value: object, where: str, what: str) -> None:
    key = where.rsplit(".", 1)[1]
    with pytest.raises(ConfigError) as caught:
        plan_file(_config(tmp_path, {key: value}))
    assert str(caught.value).count("$.") == 1
    assert where in str(caught.value) and what in str(caught.value), str(caught.value)


def test_the_test_diagnostics_key_is_accepted_while_it_is_installed(
    tmp_path: Path, peak_installed: None
) -> None:
    assert [k.key for k in registry.config_keys()][-1] == KEY
    config = _config(tmp_path, {"replay": True, KEY: {"top": 3}})
    plan = plan_file(config).plan
    assert plan.diagnostics[KEY] == 3 and plan.replay
    assert _key_diagnostics(config) == {"replay": True, KEY: {"top": 3}}
    assert _key_diagnostics(_config(tmp_path, {KEY: True}, "b.json")) == {KEY: {"top": 1}}
    assert _key_diagnostics(_config(tmp_path, {KEY: False}, "c.json")) is None


@pytest.mark.parametrize(
    ("value", "where", "what"),
    [
        ({"top": 9}, f"$.diagnostics.{KEY}.top", "expected a positive integer up to 8, got"),
        ({"top": 0}, f"$.diagnostics.{KEY}.top", "expected a positive integer up to 8, got"),
        ({"tops": 1}, f"$.diagnostics.{KEY}.tops", "unknown key; expected one of: top"),
        ("yes", f"$.diagnostics.{KEY}", "expected an object, got string"),
    ],
)
def test_a_bad_value_of_the_test_diagnostics_key_says_its_path(
    tmp_path: Path, peak_installed: None, value: object, where: str, what: str
) -> None:
    code, out, err = cli("plan", _config(tmp_path, {KEY: value}))
    assert code == 2
    assert where in err and what in err and "Traceback" not in out + err, err


def test_the_test_diagnostics_key_is_refused_when_it_is_not_installed(tmp_path: Path) -> None:
    assert registry.by_name(DIAGNOSTIC.name) is None
    code, out, err = cli("plan", _config(tmp_path, {KEY: True}))
    assert code == 2 and "Traceback" not in out + err
    assert f"$.diagnostics.{KEY}" in err
    assert "unknown key; expected one of: full_vocabulary, replay, layers, routing" in err


def test_a_config_key_is_installed_once(peak_installed: None) -> None:
    class Again:
        name = "another_name"
        config_key = DIAGNOSTIC.config_key

    with pytest.raises(ValueError, match=f"config key diagnostics.{KEY} is taken already"):
        registry.install(Again())  # type: ignore[arg-type]
    assert registry.by_name("another_name") is None


@pytest.mark.process
def test_planning_every_key_imports_no_diagnostic_torch_or_typing(tmp_path: Path) -> None:
    config = _config(tmp_path, EVERY_KEY)
    watched = (
        "torch",
        "typing",
        "msgspec",
        *(f"{folder}.diagnostic" for folder in registry.BUILTIN),
    )
    read = tuple(f"{folder}.config" for folder in registry.BUILTIN[1:5])  # the four keys
    code = (
        "import sys\n"
        "from pytest_logprob_drift.cli import main\n"
        f"assert main(['plan', {config!r}]) == 0\n"
        f"print([m for m in {watched!r} if m in sys.modules])\n"
        f"print([m for m in {read!r} if m not in sys.modules])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    absent, unread = result.stdout.splitlines()[-2:]
    assert json.loads(absent.replace("'", '"')) == []
    assert json.loads(unread.replace("'", '"')) == []  # the loader read each folder's key
