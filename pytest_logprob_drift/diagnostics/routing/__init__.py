"""The routing diagnostic: where the two sides' MoE routers chose different experts.

One folder: ``diagnostic`` (the ``Diagnostic`` the hubs loop over), ``views`` (the run table's
optional columns and the lines of the run output, the plugin's failure text and the report's
text), ``check`` (the sealed routing files and the recorded part checked offline), ``plot`` (the
report's run-scope figure over every case) and ``section`` (the report's run-scope section).
Its capture: the rollout's expert choices while it generates (``execute.rollout_experts``,
armed by ``execute.case`` when the case asks for them, as it does for the training setting
``training.moe_routing=replay``) and the trainer's teacher-forced choices with the figures
(``execute.routing``); each side's engine calls are implemented in ``runtimes/``. Its pure
computation is ``numerics.routing``. Asked for by the case's ``diagnostics.routing``: that
config key and its execution-key member are ``config`` (torch-free and typing-free, the one
module this ``__init__`` imports: config loading is on ``plan``'s path).
"""

from pytest_logprob_drift.diagnostics.routing.config import CONFIG_KEY

__all__ = ["CONFIG_KEY"]
