"""The signatures diagnostic: which known cause of silent wrong values the logged numbers
point to.

One folder: ``diagnostic`` (the ``Diagnostic`` the hubs loop over), ``check`` (the recorded
list checked offline against the one recomputed from token_diffs.pt, or computed at read time
for an attempt sealed before signatures existed) and ``section`` (the report's run-scope
section and the findings' links to it). It captures nothing: its pure computation is
``numerics.score_signatures`` over the case's scores (``numerics.signatures``). Always on.

Where its other parts stay: the report's model of the named signatures
(``report.signatures``: the step and sample ones the cases carry and the run-scope trend
computed at read time) sits below this folder, because the findings (``report.findings``) and
``report --json`` (``report.summary``) lead with them.
"""

CONFIG_KEY = None
"""Asked for by no config key."""
