"""The importance-sampling diagnostic: what the drift would cost an RL run's correction.

One folder: ``diagnostic`` (the ``Diagnostic`` the hubs loop over), ``check`` (its sealed part
computed from token_diffs.pt's tensors and checked offline) and ``section`` (the report's
columns and case panel). Its pure computation is ``numerics.importance_sampling`` (shared with
the verdict's KL figures and the attribution's ESS) and its wording ``numerics.importance_text``
(shared with the attribution's text). It has no config key (every judged case carries it), no
sealed file of its own and no engine-side capture; its attribution contribution (each knob's
ESS) is ``attribution``.
"""

CONFIG_KEY = None
"""Asked for by no config key."""
