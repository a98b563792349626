"""``--drift-report PATH``: the HTML report of each executed experiment, written at session end.

Owns finding the run directory of each configured experiment under the artifact root, naming
the page (``PATH``; with several experiments ``PATH``'s stem plus ``-<experiment id>``),
publishing it through ``report.page`` with the token decoder of ``runtimes.token_text``, and
one terminal line per page (or why it was not written). Runs on the xdist controller (or a run
without xdist), after the workers sealed their attempts and attributions. Knows nothing about
execution.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_logprob_drift.errors import UsageError, one_line
from pytest_logprob_drift.plugin.options import DriftOptions
from pytest_logprob_drift.plugin.session import PLUGIN_NAME, DriftSession
from pytest_logprob_drift.store import layout


def report_targets(options: DriftOptions) -> list[tuple[Path, Path]]:
    """``(run directory, page path)`` of each configured experiment that has a run directory."""
    if options.report is None:
        return []
    ids = set()
    for path in options.configs:
        try:
            ids.add(str(json.loads(path.read_text(encoding="utf-8"))["experiment_id"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    runs = [(options.run.artifacts / i, i) for i in sorted(ids)]
    runs = [(d, i) for d, i in runs if (d / layout.CASES).is_dir()]
    target = options.report
    if len(runs) == 1:
        return [(runs[0][0], target)]
    return [(d, target.with_name(f"{target.stem}-{i}{target.suffix}")) for d, i in runs]


def write_drift_reports(config: pytest.Config) -> None:
    """Publish the page of each experiment (never overwriting one) and say where it is."""
    session = config.pluginmanager.get_plugin(PLUGIN_NAME)
    if not isinstance(session, DriftSession):
        return
    options = session.options
    if options.report is None or options.plan_only:
        return
    from pytest_logprob_drift.report.page import publish_report
    from pytest_logprob_drift.runtimes.token_text import token_decoder

    terminal = config.pluginmanager.get_plugin("terminalreporter")
    for run_dir, target in report_targets(options):
        try:
            published = publish_report(run_dir, target, decoder_factory=token_decoder)
        except UsageError as exc:  # a page path inside the sealed tree, or a directory
            line = f"drift report not written: {exc.render()}"
        else:
            line = (
                f"drift report: {published.path}"
                if published.written
                else f"drift report {published.path} already exists; not overwritten"
            )
        if terminal is not None:
            terminal.write_line(one_line(line))
