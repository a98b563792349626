"""The path-split diagnostic: where the drift enters (decode vs prefill vs training).

One folder: ``diagnostic`` (the ``Diagnostic`` the hubs loop over), ``views`` (the run table's
cells, lines and junit properties), ``check`` (the sealed replay files and the recorded part
checked offline) and ``plot`` (the report's two figures). Its capture is ``execute.replay``
(the rollout engine's ``PrefillReplay`` / ``DecodeReplay``, implemented in ``runtimes/``); its
pure computation is ``numerics.path_split`` (shared with that capture). Asked for by the
case's ``diagnostics.replay``: that config key and its execution-key member are ``config``
(torch-free and typing-free, the one module this ``__init__`` imports: config loading is on
``plan``'s path); its attribution contribution (each comparison's ``path``) is ``attribution``.
"""

from pytest_logprob_drift.diagnostics.path_split.config import CONFIG_KEY

__all__ = ["CONFIG_KEY"]
