"""Make ``logprob_drift_operators`` importable for the operator tests before installation.

The package is normally installed (pyproject maps ``logprob_drift_operators`` to the
``operators/`` folder). When it is not, this conftest loads that folder under the installed
name so the tests exercise the same relative imports. It is a no-op once the package imports.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PACKAGE = "logprob_drift_operators"
OPERATORS_DIR = Path(__file__).resolve().parents[2] / "operators"


def ensure_operators_importable() -> None:
    """Register ``operators/`` as ``logprob_drift_operators`` unless it already imports."""
    if PACKAGE in sys.modules or importlib.util.find_spec(PACKAGE) is not None:
        return
    spec = importlib.util.spec_from_file_location(
        PACKAGE,
        OPERATORS_DIR / "__init__.py",
        submodule_search_locations=[str(OPERATORS_DIR)],
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {PACKAGE} from {OPERATORS_DIR}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    spec.loader.exec_module(module)


ensure_operators_importable()
