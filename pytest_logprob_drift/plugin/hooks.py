"""pytest hooks only: options, collection of ``--drift-config`` files, outcome reporting.

Owns the ``--drift-*`` flags and ``drift_*`` ini keys (a flag overrides its ini value; bad
values raise ``pytest.UsageError``), adding the configured experiment files to the collection
(``--drift-config`` files always; the ``drift_config`` ini list, like ``testpaths``, only when
the command line names no paths), the two hooks a conftest implements to add experiment
configs and operator backend descriptors (``DriftHookSpecs``), the session's operator catalog
(built-ins, entry points and those hooks: used for planning and execution alike), the
session-scoped runner per experiment (engines pooled by fingerprint, torn down when no
remaining item needs them, closed at session end, their construction counts summed, across
xdist workers too), ``-k`` selection by case label (``-k "batch.size=1"``), the outcome status
words and letters, the per-outcome terminal summary, and tagging reports with the outcome
(JSON-safe, so it travels from xdist workers). The logic lives in ``items`` and the library
modules. Importing this module never imports torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_logprob_drift.errors import ConfigError, DriftError
from pytest_logprob_drift.execute.runtime_catalog import RUNTIMES
from pytest_logprob_drift.outcomes import Outcome, parse_expectation
from pytest_logprob_drift.plan.planner import KNOBS
from pytest_logprob_drift.plugin.items import (
    DriftCaseItem,
    DriftConfigFile,
    DriftOptions,
    keyword_token,
)
from pytest_logprob_drift.registry.catalog import OperatorDescriptor, SemanticOperatorCatalog

if TYPE_CHECKING:
    from pytest_logprob_drift.execute.runner import Runner

OPTIONS_KEY = pytest.StashKey[DriftOptions]()
RUNNERS_KEY = pytest.StashKey[dict[str, "Runner"]]()
CATALOG_KEY = pytest.StashKey[SemanticOperatorCatalog]()
CONSTRUCTIONS_KEY = pytest.StashKey[Counter[str]]()
"""Engine constructions of the runners closed so far: ``rollout`` and ``training``."""
WORKEROUTPUT_CONSTRUCTIONS = "logprob_drift_engine_constructions"


class DriftHookSpecs:
    """Hooks a ``conftest.py`` (an initial one: rootdir, invocation or argument directory)
    or a plugin implements to extend a drift session."""

    @pytest.hookspec
    def pytest_logprob_drift_configs(self, config: pytest.Config) -> Sequence[str | Path]:
        """Experiment config files to collect, as if given with ``--drift-config`` (relative
        paths are relative to the invocation directory). Called once in ``pytest_configure``;
        the files must exist then and be the same on every xdist worker."""
        raise NotImplementedError

    @pytest.hookspec
    def pytest_logprob_drift_operators(
        self, config: pytest.Config,
    ) -> Sequence[OperatorDescriptor | Mapping[str, Any]]:
        """Operator backend descriptors to add to the catalog for this session, as
        ``OperatorDescriptor`` records or the plain-dict form entry points return. Planning
        (operator binding) and execution (the runner's catalog) both see them. Smoke-only
        descriptors are refused. Called once, when the first config is collected."""
        raise NotImplementedError


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(DriftHookSpecs)


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
                  help="experiment configs collected as drift cases when no path is given")
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


def _config_paths(config: pytest.Config) -> tuple[list[Path], list[Path]]:
    """``(configs, configs to add to the collection arguments)``."""
    invocation = config.invocation_params.dir
    flag_configs = config.getoption("drift_config")
    if flag_configs is not None:
        configs = [invocation / p for p in flag_configs]
        sources = ["--drift-config"] * len(configs)
        added = list(configs)
    else:
        configs = [Path(p) for p in config.getini("drift_config")]
        sources = ["ini drift_config"] * len(configs)
        explicit = config.args_source is pytest.Config.ArgsSource.ARGS
        added = [] if explicit else list(configs)
    for results in config.hook.pytest_logprob_drift_configs(config=config):
        hooked = [invocation / p for p in results]
        configs.extend(hooked)
        sources.extend(["pytest_logprob_drift_configs"] * len(hooked))
        added.extend(hooked)
    for path, source in zip(configs, sources, strict=True):
        if not path.is_file():
            raise pytest.UsageError(f"{source} {path}: file not found")
    return configs, added


def _options(config: pytest.Config) -> tuple[DriftOptions, list[Path]]:
    invocation = config.invocation_params.dir
    configs, added = _config_paths(config)
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
    options = DriftOptions(
        configs=tuple(sorted({p.resolve() for p in configs})),
        runtime=runtime,
        allow_smoke=bool(_option(config, "allow_smoke_operators")),
        artifacts=(invocation / artifacts).resolve(),
        plan_only=plan_only,
        expectations=expectations,
        pairwise=bool(_option(config, "pairwise")),
    )
    return options, added


def _named_by_args(config: pytest.Config, path: Path) -> bool:
    """Whether a collection argument already names ``path`` (maybe with ``::`` node parts)."""
    invocation = config.invocation_params.dir
    resolved = path.resolve()
    return any((invocation / arg.split("::", 1)[0]).resolve() == resolved
               for arg in config.args)


def _keyword_for_labels(expression: str) -> str:
    """``-k`` cannot spell ``=`` or ``,`` (case labels use both); items also carry their label
    with those replaced (``keyword_token``), so an expression like ``batch.size=1`` selects."""
    return keyword_token(expression) if "=" in expression or "," in expression else expression


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "drift: a logprob-drift experiment case")
    config.addinivalue_line("markers", "drift_baseline: the baseline case of an experiment")
    config.addinivalue_line("markers", "drift_intervention: a case that changes knobs")
    for level in ("S0", "S1", "S2", "S3"):
        config.addinivalue_line("markers", f"drift_{level}: case of scenario level {level}")
    from pytest_logprob_drift.plugin.items import marker_name

    for path in KNOBS:
        config.addinivalue_line("markers", f"drift_knob_{marker_name(path)}: case changes "
                                f"{path}")
    options, added = _options(config)
    config.stash[OPTIONS_KEY] = options
    config.stash[RUNNERS_KEY] = {}
    config.stash[CONSTRUCTIONS_KEY] = Counter()
    config.pluginmanager.register(OutcomeCounter(config), "logprob-drift-outcomes")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistConstructions(config), "logprob-drift-xdist")
        if hasattr(config, "workerinput") and config.getvalue("loadgroup"):
            config.pluginmanager.register(XdistGroupIds(), "logprob-drift-xdist-groups")
    keyword: str = getattr(config.option, "keyword", "") or ""
    if options.configs and keyword:
        config.option.keyword = _keyword_for_labels(keyword)
    for config_path in added:
        if not _named_by_args(config, config_path):
            config.args.append(str(config_path.resolve()))


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> DriftConfigFile | None:
    options = parent.config.stash.get(OPTIONS_KEY, None)
    if options is not None and options.configs and file_path.resolve() in options.configs:
        return DriftConfigFile.from_parent(parent, path=file_path)
    return None


def session_catalog(config: pytest.Config) -> SemanticOperatorCatalog:
    """The operator catalog of this session: built-ins, entry points and
    ``pytest_logprob_drift_operators`` (computed once; raises ConfigError on a bad one)."""
    if CATALOG_KEY not in config.stash:
        from pytest_logprob_drift.registry.catalog import default_catalog

        extra: list[OperatorDescriptor] = []
        for results in config.hook.pytest_logprob_drift_operators(config=config):
            for item in results:
                descriptor = item if isinstance(item, OperatorDescriptor) \
                    else OperatorDescriptor.from_mapping(item)
                if descriptor.is_smoke_only:
                    raise ConfigError(f"operator {descriptor.backend_id}", "smoke-only "
                                      "backends cannot be registered through "
                                      "pytest_logprob_drift_operators")
                extra.append(descriptor)
        config.stash[CATALOG_KEY] = default_catalog().with_descriptors(extra)
    return config.stash[CATALOG_KEY]


def runner_for(item: DriftCaseItem) -> Runner:
    """The session-scoped runner of the item's experiment (created on first use)."""
    from pytest_logprob_drift.execute.runner import Runner

    runners = item.config.stash[RUNNERS_KEY]
    key = str(item.path)
    if key not in runners:
        options = item.config.stash[OPTIONS_KEY]
        assert options.runtime is not None
        runners[key] = Runner(item.execution_plan, runtime=options.runtime,
                              artifacts=options.artifacts, allow_smoke=options.allow_smoke,
                              expectations=options.expectations,
                              catalog=session_catalog(item.config))
    return runners[key]


def pytest_sessionfinish(session: pytest.Session) -> None:
    runners = session.config.stash.get(RUNNERS_KEY, {})
    counts = session.config.stash.get(CONSTRUCTIONS_KEY, Counter())
    while runners:
        _, runner = runners.popitem()
        runner.close()
        counts["rollout"] += runner.pool.rollout_constructions
        counts["training"] += runner.pool.training_constructions
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None and counts:
        workeroutput[WORKEROUTPUT_CONSTRUCTIONS] = dict(counts)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) \
        -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if isinstance(item, DriftCaseItem) and call.when == "call":
        properties = dict(item.user_properties)
        outcome = properties.get("drift_outcome")
        if outcome is None and item.config.stash[OPTIONS_KEY].plan_only:
            outcome = Outcome.PLAN_ONLY.value
        if outcome is not None:
            report.drift_outcome = outcome  # type: ignore[attr-defined]
            report.drift_expected = properties.get(  # type: ignore[attr-defined]
                "drift_expected", Outcome.PASS.value)
    return report


class XdistConstructions:
    """On the xdist controller: adds up the engine constructions each worker reports."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_testnodedown(self, node: Any, error: object) -> None:
        counts = getattr(node, "workeroutput", {}).get(WORKEROUTPUT_CONSTRUCTIONS, {})
        self.config.stash[CONSTRUCTIONS_KEY].update(counts)


class XdistGroupIds:
    """On an xdist worker under ``--dist loadgroup``: make sure each drift item's node id
    carries its ``@<xdist_group>`` suffix, which is what the controller groups by.

    pytest-xdist sets the suffix through the legacy ``_nodeid`` field, which pytest >= 9.2
    (structured node ids) no longer reads, so grouping silently stops (pytest-xdist#1386).
    This sets the structured id the same way, only where the suffix is missing, so it does
    nothing once xdist is fixed or on older pytest."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            mark = item.get_closest_marker("xdist_group")
            node_id = getattr(item, "_id", None)
            if not isinstance(item, DriftCaseItem) or mark is None or node_id is None \
                    or "@" in item.nodeid:
                continue
            group = mark.args[0] if mark.args else mark.kwargs.get("name", "default")
            item._id = type(node_id).parse(f"{item.nodeid}@{group}")


class OutcomeCounter:
    """Counts drift outcomes of reports (on the xdist controller too) and prints them, with
    the engine constructions of the session."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.counts: Counter[str] = Counter()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome = getattr(report, "drift_outcome", None)
        if outcome is not None and report.when == "call":
            self.counts[outcome] += 1

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        constructions = self.config.stash.get(CONSTRUCTIONS_KEY, Counter())
        if not self.counts and not constructions:
            return
        terminalreporter.write_sep("=", "logprob drift outcomes")
        if self.counts:
            terminalreporter.write_line(", ".join(f"{self.counts[o.value]} {o.value}"
                                                  for o in Outcome if self.counts[o.value]))
        if constructions:
            terminalreporter.write_line(f"engine constructions: rollout "
                                        f"{constructions['rollout']}, training "
                                        f"{constructions['training']}")


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) \
        -> tuple[str, str, str] | None:
    outcome = getattr(report, "drift_outcome", None)
    if outcome is None or report.when != "call":
        return None
    word = Outcome(outcome)
    if report.failed:
        if word is Outcome.PASS:
            expected = getattr(report, "drift_expected", Outcome.PASS.value)
            return "failed", "F", f"PASS (expected {expected})"
        return "failed", word.letter, word.value
    if report.passed:
        return "passed", "." if word is Outcome.PASS else word.letter.lower(), \
            f"{word.value} (expected)" if word is not Outcome.PASS else "PASS"
    if report.skipped and word is Outcome.PLAN_ONLY:
        return "skipped", word.letter, word.value
    return None
