"""Production semantic-operator backends for pytest-logprob-drift.

Installed under the import name ``logprob_drift_operators``. This package owns only the
numerical implementations of semantic operators (today: ``selected_logprob``) and the plain
capability descriptions of each backend. It must not know the drift framework: no planner,
runner, catalog, artifact or comparison types are imported here, and nothing in this package
decides pass/fail. Modules inside use relative imports only, so the folder works under any
import name.
"""

from __future__ import annotations

__all__: list[str] = []
