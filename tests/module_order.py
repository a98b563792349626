"""The order the suite's modules run in: the heavy ones first, so that two workers finish together.

Under pytest-xdist's ``--dist loadfile`` each worker takes the next module of the queue when it
runs dry. xdist re-sorted that queue by test count, which put the engine modules (few tests,
minutes each) last, where whichever worker drew the last of them ran it alone while the other
sat idle. Here collection orders the modules by cost class instead (a ``slow`` test, then a
``process`` test, then the rest, most tests first), each module's tests kept together in their
own order, and xdist keeps that order: the many cheap modules at the end fill in around the
engine modules.
"""

from __future__ import annotations

import pytest


def keep_collection_order(config: pytest.Config) -> None:
    """Turn off xdist's re-sort of the module queue by test count (when xdist is installed),
    and hand out whole modules under ``-n N`` alone: xdist's default there (``--dist load``)
    deals a module's tests round-robin, so both workers built its module-scoped fixtures (a
    sealed run, a report) and both imported what its first test imports (vLLM: seconds). An
    explicit ``--dist`` is kept."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if getattr(config.option, "dist", "no") == "load" and not _dist_given(
        config.invocation_params.args
    ):
        config.option.dist = "loadfile"


def _dist_given(args: tuple[str, ...] | list[str]) -> bool:
    return any(a in ("-d", "--distload", "--dist") or a.startswith("--dist=") for a in args)


def _cost_class(tests: list[pytest.Item]) -> tuple[int, int]:
    if any(t.get_closest_marker("slow") is not None for t in tests):
        return (0, 0)
    if any(t.get_closest_marker("process") is not None for t in tests):
        return (1, 0)
    return (2, -len(tests))


def heavy_modules_first(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place: modules by cost class, stable within a class."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    items[:] = [item for tests in sorted(modules.values(), key=_cost_class) for item in tests]
