"""The pytest11 entry point: pytest hooks only.

Owns the hook implementations of the logprob-drift plugin and nothing else: registering the
options and hookspecs, configuring a session (markers, validated options, the session object
``plugin.session.DriftSession`` and the other plugin objects, the ``-k`` rewrite, adding
``--drift-config`` files to the collection), collecting experiment files, tagging reports,
status words and writing the ``--drift-report`` page. Each hook delegates to the module that
owns the work: ``options``, ``session``, ``items``, ``reporting``, ``xdist``,
``drift_report``. Importing this module never imports torch.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest

from pytest_logprob_drift.plan.knobs import KNOBS
from pytest_logprob_drift.plugin.drift_report import write_drift_reports
from pytest_logprob_drift.plugin.hookspecs import DriftHookSpecs
from pytest_logprob_drift.plugin.items import (
    DriftCaseItem,
    DriftCollectionErrors,
    DriftConfigFile,
    check_configs,
)
from pytest_logprob_drift.plugin.options import (
    add_options,
    keyword_for_labels,
    marker_name,
    named_by_args,
    resolve_options,
)
from pytest_logprob_drift.plugin.reporting import OutcomeCounter, status_of, tag_report
from pytest_logprob_drift.plugin.session import PLUGIN_NAME, DriftSession, drift_session
from pytest_logprob_drift.policy import runtime_catalog


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(DriftHookSpecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser, runtime_catalog().names)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "drift: a logprob-drift experiment case")
    config.addinivalue_line("markers", "drift_baseline: the baseline case of an experiment")
    config.addinivalue_line("markers", "drift_intervention: a case that changes knobs")
    for level in ("S0", "S1", "S2", "S3"):
        config.addinivalue_line("markers", f"drift_{level}: case of scenario level {level}")
    for path in KNOBS:
        config.addinivalue_line("markers", f"drift_knob_{marker_name(path)}: case changes {path}")
    runtimes = runtime_catalog()
    options, added = resolve_options(config, runtimes)
    config.pluginmanager.register(DriftSession(config, options, runtimes), PLUGIN_NAME)
    config.pluginmanager.register(OutcomeCounter(config), "logprob-drift-outcomes")
    config.pluginmanager.register(DriftCollectionErrors(config), "logprob-drift-collection")
    if config.pluginmanager.hasplugin("xdist"):
        from pytest_logprob_drift.plugin.xdist import XdistConstructions, XdistGroupIds

        config.pluginmanager.register(XdistConstructions(config), "logprob-drift-xdist")
        if hasattr(config, "workerinput") and config.getvalue("loadgroup"):
            config.pluginmanager.register(XdistGroupIds(), "logprob-drift-xdist-groups")
    keyword: str = getattr(config.option, "keyword", "") or ""
    if options.configs and keyword:
        config.option.keyword = keyword_for_labels(keyword)
    if (
        config.getoption("drift_config") is not None
        and config.args_source is not pytest.Config.ArgsSource.ARGS
    ):
        # --drift-config with no paths: the drift cases only, never the testpaths or the
        # directory's own test suite (pytest run from a repository root)
        config.args[:] = []
    for config_path in added:
        if not named_by_args(config, config_path):
            config.args.append(str(config_path.resolve()))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # xdist workers: the controller checked
        check_configs(session.config)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> DriftConfigFile | None:
    configs = drift_session(parent.config).options.configs
    if configs and file_path.resolve() in configs:
        return DriftConfigFile.from_parent(parent, path=file_path)
    return None


def pytest_sessionfinish(session: pytest.Session) -> None:
    if getattr(session.config, "workeroutput", None) is None:  # the controller writes it
        write_drift_reports(session.config)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if not isinstance(item, DriftCaseItem):
        return report
    if call.when == "call":
        tag_report(report, item.user_properties, drift_session(item.config).options.plan_only)
    elif call.when == "setup" and report.failed and call.excinfo is not None:
        report.longrepr = item.repr_failure(call.excinfo)  # one line, not a traceback
    return report


def pytest_report_teststatus(
    report: pytest.TestReport, config: pytest.Config
) -> tuple[str, str, str] | None:
    return status_of(report)
