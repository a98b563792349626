"""The full-vocabulary diagnostic with its semantic offset: how far the two sides' whole
next-token distributions are apart, and whether a sampling-processing offset explains it.

One folder: ``diagnostic`` (the ``Diagnostic`` the hubs loop over; its parts are the declared
members ``diagnostics.full_vocabulary`` and ``diagnostics.semantic_offset``, its sealed file
``divergence.pt``) and ``check`` (the sealed tensors and the recorded parts checked offline).
Its capture is ``execute.diagnostics`` (the engines hand back their full distributions under
``RuntimeBinding.full_vocabulary``, implemented in ``runtimes/``); its pure computation is
``numerics.full_vocabulary`` / ``numerics.semantic_offset`` / ``numerics.divergence_file``
and its run-output wording ``numerics.text`` (shared with the report, whose columns and case
section still name it: ``report.summary``, ``report.columns``, ``report.html``).
"""

from pytest_logprob_drift.diagnostics.full_vocabulary.diagnostic import DIAGNOSTIC

__all__ = ["DIAGNOSTIC"]
