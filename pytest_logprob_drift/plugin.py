"""pytest hooks only: options, collection of ``--drift-config`` files, outcome reporting.

Owns the ``--drift-*`` flags and ``drift_*`` ini keys (a flag overrides its ini value; bad
values raise ``pytest.UsageError``), adding the configured experiment files to the collection,
the session-scoped runner per experiment (engines pooled by fingerprint, torn down when no
remaining item needs them, closed at session end), the outcome status words and letters, the
per-outcome terminal summary, and tagging reports with the outcome (JSON-safe, so it travels
from xdist workers). The logic lives in ``items`` and the library modules. Importing this
module never imports torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .errors import DriftError
from .items import DriftCaseItem, DriftConfigFile, DriftOptions
from .outcomes import Outcome, parse_expectation
from .planner import KNOBS
from .runtime_catalog import RUNTIMES

if TYPE_CHECKING:
    from .runner import Runner

OPTIONS_KEY = pytest.StashKey[DriftOptions]()
RUNNERS_KEY = pytest.StashKey[dict[str, "Runner"]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("logprob-drift", "rollout/training logprob drift experiments")
    group.addoption("--drift-config", action="append", default=None, metavar="PATH",
                    help="experiment config; one test item per planned case (repeatable)")
    group.addoption("--drift-runtime", default=None, metavar="NAME",
                    help=f"runtime that executes the cases: {', '.join(sorted(RUNTIMES))}")
    group.addoption("--drift-allow-smoke-operators", action="store_true", default=None,
                    help="register and authorize the smoke-only selected_logprob backends")
    group.addoption("--drift-artifacts", default=None, metavar="DIR",
                    help="artifact root (default: runs/ under the invocation directory)")
    group.addoption("--drift-plan-only", action="store_true", default=None,
                    help="collect and plan the cases, execute nothing")
    group.addoption("--drift-expect", action="append", default=None,
                    metavar="SELECTOR=OUTCOME", help="expected outcome of matching cases")
    group.addoption("--drift-pairwise", action="store_true", default=None,
                    help="also expand the config's listed path pairs")
    parser.addini("drift_config", type="paths", default=[],
                  help="experiment configs collected as drift cases")
    parser.addini("drift_runtime", default="", help="default --drift-runtime")
    parser.addini("drift_allow_smoke_operators", type="bool", default=False,
                  help="default --drift-allow-smoke-operators")
    parser.addini("drift_artifacts", default="", help="default --drift-artifacts")
    parser.addini("drift_plan_only", type="bool", default=False, help="default "
                  "--drift-plan-only")
    parser.addini("drift_expect", type="linelist", default=[], help="default --drift-expect")
    parser.addini("drift_pairwise", type="bool", default=False, help="default --drift-pairwise")


def _option(config: pytest.Config, name: str) -> Any:
    value = config.getoption(f"drift_{name}")
    return config.getini(f"drift_{name}") if value is None else value


def _options(config: pytest.Config) -> DriftOptions:
    invocation = config.invocation_params.dir
    flag_configs = config.getoption("drift_config")
    configs = [invocation / p for p in flag_configs] if flag_configs is not None \
        else [Path(p) for p in config.getini("drift_config")]
    for path in configs:
        if not path.is_file():
            raise pytest.UsageError(f"--drift-config {path}: file not found")
    runtime = _option(config, "runtime") or None
    if runtime is not None and runtime not in RUNTIMES:
        raise pytest.UsageError(f"--drift-runtime {runtime!r}: unknown runtime; one of "
                                f"{', '.join(sorted(RUNTIMES))}")
    plan_only = bool(_option(config, "plan_only"))
    if configs and runtime is None and not plan_only and not config.option.collectonly:
        raise pytest.UsageError("--drift-config needs --drift-runtime NAME (or the ini key "
                                "drift_runtime) to execute cases; add --drift-plan-only to "
                                "only plan them")
    try:
        expectations = tuple(parse_expectation(t) for t in _option(config, "expect"))
    except DriftError as exc:
        raise pytest.UsageError(exc.render().replace("--expect", "--drift-expect")) from None
    artifacts = _option(config, "artifacts") or "runs"
    return DriftOptions(
        configs=tuple(sorted({p.resolve() for p in configs})),
        runtime=runtime,
        allow_smoke=bool(_option(config, "allow_smoke_operators")),
        artifacts=(invocation / artifacts).resolve(),
        plan_only=plan_only,
        expectations=expectations,
        pairwise=bool(_option(config, "pairwise")),
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "drift: a logprob-drift experiment case")
    config.addinivalue_line("markers", "drift_baseline: the baseline case of an experiment")
    config.addinivalue_line("markers", "drift_intervention: a case that changes knobs")
    for level in ("S0", "S1", "S2", "S3"):
        config.addinivalue_line("markers", f"drift_{level}: case of scenario level {level}")
    from .items import marker_name

    for path in KNOBS:
        config.addinivalue_line("markers", f"drift_knob_{marker_name(path)}: case changes "
                                f"{path}")
    options = _options(config)
    config.stash[OPTIONS_KEY] = options
    config.stash[RUNNERS_KEY] = {}
    config.pluginmanager.register(OutcomeCounter(), "logprob-drift-outcomes")
    for config_path in options.configs:
        if str(config_path) not in config.args:
            config.args.append(str(config_path))


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> DriftConfigFile | None:
    options = parent.config.stash.get(OPTIONS_KEY, None)
    if options is not None and file_path.resolve() in options.configs:
        return DriftConfigFile.from_parent(parent, path=file_path)
    return None


def runner_for(item: DriftCaseItem) -> Runner:
    """The session-scoped runner of the item's experiment (created on first use)."""
    from .runner import Runner

    runners = item.config.stash[RUNNERS_KEY]
    key = str(item.path)
    if key not in runners:
        options = item.config.stash[OPTIONS_KEY]
        assert options.runtime is not None
        runners[key] = Runner(item.execution_plan, runtime=options.runtime,
                              artifacts=options.artifacts, allow_smoke=options.allow_smoke,
                              expectations=options.expectations)
    return runners[key]


def pytest_sessionfinish(session: pytest.Session) -> None:
    runners = session.config.stash.get(RUNNERS_KEY, {})
    while runners:
        _, runner = runners.popitem()
        runner.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) \
        -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if isinstance(item, DriftCaseItem) and call.when == "call":
        outcome = dict(item.user_properties).get("drift_outcome")
        if outcome is None and item.config.stash[OPTIONS_KEY].plan_only:
            outcome = Outcome.PLAN_ONLY.value
        if outcome is not None:
            report.drift_outcome = outcome  # type: ignore[attr-defined]
    return report


class OutcomeCounter:
    """Counts drift outcomes of reports (on the xdist controller too) and prints them."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome = getattr(report, "drift_outcome", None)
        if outcome is not None and report.when == "call":
            self.counts[outcome] += 1

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.counts:
            return
        terminalreporter.write_sep("=", "logprob drift outcomes")
        terminalreporter.write_line(", ".join(f"{self.counts[o.value]} {o.value}"
                                              for o in Outcome if self.counts[o.value]))


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) \
        -> tuple[str, str, str] | None:
    outcome = getattr(report, "drift_outcome", None)
    if outcome is None or report.when != "call":
        return None
    word = Outcome(outcome)
    if report.failed:
        return "failed", word.letter, word.value
    if report.passed:
        return "passed", "." if word is Outcome.PASS else word.letter.lower(), \
            f"{word.value} (expected)" if word is not Outcome.PASS else "PASS"
    return None

