"""The run settings: the execution policy a frontend hands the runner, as one frozen record.

Owns ``RunSettings``, what a frontend decided about a run before anything executes, and
``run_settings``, the one validation of the raw values both frontends read from their own
flags (the bound on baseline repeats is ``MAX_BASELINE_REPEATS``). A ``Setting`` names each
value; a frontend hands its ``Spelling`` of them (the CLI's ``--launcher``, the plugin's
``--drift-launcher`` or ini ``drift_launcher``) and every refusal is one line naming the
setting as that frontend spells it (the ``Remedy`` idea of ``errors``). Knows nothing about
argparse, pytest, torch or any runtime; nothing here imports them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_logprob_drift.errors import UsageError, one_line
from pytest_logprob_drift.execute.launch import LAUNCHERS, Launch
from pytest_logprob_drift.outcomes import Expectation, parse_expectation
from pytest_logprob_drift.store.keys import SealKey, load_seal_key

MAX_BASELINE_REPEATS = 100
"""The most executions of a baseline one run asks for: each seals one more attempt, and a
noise floor is known long before a hundred (the 256-case cap bounds planning the same way)."""


class Setting(enum.Enum):
    """One value of the execution policy; each frontend spells it as its own flag."""

    RUNTIME = "runtime"
    EXPECT = "expect"
    BASELINE_REPEATS = "baseline_repeats"
    LAUNCHER = "launcher"
    RAY_ADDRESS = "ray_address"
    RAY_NUM_CPUS = "ray_num_cpus"
    RAY_RANK_CPUS = "ray_rank_cpus"
    SERIAL = "serial"
    SEAL_KEY_FILE = "seal_key_file"
    SEAL_KEY_ENV = "seal_key_env"


Spelling = Mapping[Setting, str]
"""How a frontend names each setting in its messages (a setting it does not spell is one the
frontend fixes itself, never the user: the plugin runs cases one at a time)."""

_RAY_ONLY = (Setting.RAY_ADDRESS, Setting.RAY_NUM_CPUS, Setting.RAY_RANK_CPUS, Setting.SERIAL)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSettings:
    """What a frontend decided about a run before anything executes (never in a config)."""

    runtime: str | None
    """The runtime that executes the cases (None: the plugin only plans or collects)."""
    artifacts: Path
    allow_test_only: bool = False
    """Register and authorize the smoke-only (test-only) operator backends."""
    expectations: tuple[Expectation, ...] = ()
    baseline_repeats: int = 1
    """Executions of the baseline with the same engines: the attribution's noise floor."""
    launch: Launch = field(default_factory=Launch)
    show_engine_logs: bool = False
    """vLLM's own logs on the terminal instead of a file under the artifacts."""
    seal_key: SealKey | None = None
    replay: bool = False
    """Opt-in replay diagnostics for every case of the run (``diagnostics.replay``), whatever
    the config says; changes what is sealed, never a verdict."""


def run_settings(
    spelling: Spelling,
    *,
    runtime: str | None,
    runtimes: Sequence[str],
    artifacts: Path,
    allow_test_only: bool = False,
    expect: Sequence[str] = (),
    baseline_repeats: object = 1,
    launcher: object = "local",
    ray_address: str | None = None,
    ray_num_cpus: int | None = None,
    ray_rank_cpus: float = 1.0,
    serial: bool = False,
    show_engine_logs: bool = False,
    seal_key_file: str | None = None,
    seal_key_env: str | None = None,
    replay: bool = False,
) -> RunSettings:
    """The validated settings (UsageError: one line naming the setting as ``spelling`` spells
    it). ``runtimes`` are the names a runtime may have; ``None`` values were not given."""
    if runtime is not None and runtime not in runtimes:
        raise UsageError(
            f"{spelling[Setting.RUNTIME]} {runtime!r}: unknown runtime {runtime!r}; "
            f"known: {', '.join(runtimes)}"
        )
    try:
        expectations = tuple(parse_expectation(text) for text in expect)
    except UsageError as exc:
        raise UsageError(f"{spelling[Setting.EXPECT]} {exc}") from None
    key = load_seal_key(
        file=seal_key_file,
        env=seal_key_env,
        flags=(spelling[Setting.SEAL_KEY_FILE], spelling[Setting.SEAL_KEY_ENV]),
    )
    return RunSettings(
        runtime=runtime,
        artifacts=artifacts,
        allow_test_only=allow_test_only,
        expectations=expectations,
        baseline_repeats=_repeats(spelling[Setting.BASELINE_REPEATS], baseline_repeats),
        launch=_launch(spelling, launcher, ray_address, ray_num_cpus, ray_rank_cpus, serial),
        show_engine_logs=show_engine_logs,
        seal_key=key,
        replay=bool(replay),
    )


def _repeats(name: str, raw: object) -> int:
    text = str(raw).strip()
    if not text.isdigit() or not 1 <= int(text) <= MAX_BASELINE_REPEATS:
        raise UsageError(
            one_line(
                f"{name} {text!r}: expected a positive integer, at most {MAX_BASELINE_REPEATS} "
                "(each repeat seals one more attempt of the baseline)"
            )
        )
    return int(text)


def _launch(
    spelling: Spelling,
    launcher: object,
    ray_address: str | None,
    ray_num_cpus: int | None,
    rank_cpus: float,
    serial: bool,
) -> Launch:
    if launcher not in LAUNCHERS:
        raise UsageError(
            one_line(
                f"{spelling[Setting.LAUNCHER]} {launcher!r}: expected "
                + " or ".join(repr(name) for name in LAUNCHERS)
            )
        )
    given = {
        Setting.RAY_ADDRESS: bool(ray_address),
        Setting.RAY_NUM_CPUS: bool(ray_num_cpus),
        Setting.RAY_RANK_CPUS: rank_cpus != 1.0,
        Setting.SERIAL: serial,
    }
    spelled = [spelling[s] for s in _RAY_ONLY if s in spelling]
    if launcher != "ray" and any(given[s] for s in _RAY_ONLY if s in spelling):
        names = spelled[0] if len(spelled) == 1 else f"{', '.join(spelled[:-1])} and {spelled[-1]}"
        verb = "needs" if len(spelled) == 1 else "need"
        raise UsageError(f"{names} {verb} {spelling[Setting.LAUNCHER]} ray")
    if ray_num_cpus is not None and ray_num_cpus < 1 and Setting.RAY_NUM_CPUS in spelling:
        raise UsageError(f"{spelling[Setting.RAY_NUM_CPUS]} {ray_num_cpus}: expected at least 1")
    if not 0 < rank_cpus <= 1024 and Setting.RAY_RANK_CPUS in spelling:
        raise UsageError(f"{spelling[Setting.RAY_RANK_CPUS]} {rank_cpus}: expected (0, 1024]")
    return Launch(
        launcher=str(launcher),
        ray_address=ray_address or None,
        ray_num_cpus=ray_num_cpus,
        concurrent=not serial,
        rank_cpus=rank_cpus,
    )
