"""The layers diagnostic: where in the network the two sides' states part.

One folder: ``diagnostic`` (the ``Diagnostic`` the hubs loop over), ``check`` (the sealed
layer files and the recorded part checked offline) and ``plot`` (the report's two per-case
figures). Its capture is ``execute.layers`` (each side's ``capture_layers``, implemented in
``runtimes/``); its pure computation is ``numerics.layer_reduction`` (shared with that
capture); its text views are ``numerics.layer_text`` (also read by ``attribution.text`` and
``report.findings``, which sit below this folder). Asked for by the case's
``diagnostics.layers`` (config and execution key unchanged, in ``config/``).

Where its other parts stay (not yet contributions through the protocol, which has no member
for them): the per-layer noise floor and the attribution's first moved layer are computed in
``attribution.layers`` (and shown by ``attribution.text.layer_properties`` /
``report.findings``); the run-scope figure over every case is ``report.layer_lines`` (drawn by
``report.html``).
"""

from pytest_logprob_drift.diagnostics.layers.diagnostic import DIAGNOSTIC

__all__ = ["DIAGNOSTIC"]
