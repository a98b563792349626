"""The layers diagnostic: where in the network the two sides' states part.

One folder: ``diagnostic`` (the ``Diagnostic`` the hubs loop over), ``check`` (the sealed
layer files and the recorded part checked offline), ``text`` (the run table's cells, lines and
junit properties), ``plot`` (the report's two per-case figures), ``run_plot`` (the report's
run-scope section: every case's per-layer lines on one plot) and ``attribution`` (its
contribution to the attribution document: the per-state noise floor, each comparison's first
moved layer and where the drift enters). Its capture is ``execute.layers`` (each side's
``capture_layers``, implemented in ``runtimes/``); its pure computation is
``numerics.layer_reduction`` (shared with that capture). The states' names and words are
``numerics.layer_states``, below the folder: ``attribution.text`` and ``report.findings`` show
the attribution document's layer members with them. Asked for by the case's
``diagnostics.layers``: that config key and its execution-key member are ``config``
(torch-free and typing-free, the one module this ``__init__`` imports: config loading is on
``plan``'s path).
"""

from pytest_logprob_drift.diagnostics.layers.config import CONFIG_KEY

__all__ = ["CONFIG_KEY"]
