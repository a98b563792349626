"""pytest-xdist integration: construction counts from workers, ``xdist_group`` node ids.

Owns the two plugin objects registered only when xdist is loaded: on the controller, adding up
the engine constructions each worker reports; on a worker under ``--dist loadgroup``, making
sure each drift item's node id carries its ``@<group>`` suffix (the pytest-xdist#1386
workaround). Knows nothing about execution.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_logprob_drift.plugin.items import DriftCaseItem
from pytest_logprob_drift.plugin.session import drift_session

WORKEROUTPUT_CONSTRUCTIONS = "logprob_drift_engine_constructions"


class XdistConstructions:
    """On the xdist controller: adds up the engine constructions each worker reports."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_testnodedown(self, node: Any, error: object) -> None:
        counts = getattr(node, "workeroutput", {}).get(WORKEROUTPUT_CONSTRUCTIONS, {})
        drift_session(self.config).constructions.update(counts)


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
            if (
                not isinstance(item, DriftCaseItem)
                or mark is None
                or node_id is None
                or "@" in item.nodeid
            ):
                continue
            group = mark.args[0] if mark.args else mark.kwargs.get("name", "default")
            item._id = type(node_id).parse(f"{item.nodeid}@{group}")
