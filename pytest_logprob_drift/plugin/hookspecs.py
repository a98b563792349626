"""The hooks a conftest or plugin implements to extend a drift session.

Owns ``DriftHookSpecs``: adding experiment configs and operator backend descriptors. Knows
nothing about how they are used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from pytest_logprob_drift.records import JsonValue
from pytest_logprob_drift.registry.catalog import OperatorDescriptor


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
        self,
        config: pytest.Config,
    ) -> Sequence[OperatorDescriptor | Mapping[str, JsonValue]]:
        """Operator backend descriptors to add to the catalog for this session, as
        ``OperatorDescriptor`` records or the plain-dict form entry points return. Planning
        (operator binding) and execution (the runner's catalog) both see them. Test-only
        descriptors are refused. Called once, when the first config is collected."""
        raise NotImplementedError
