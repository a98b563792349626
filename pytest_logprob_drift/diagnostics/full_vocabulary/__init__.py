"""The full-vocabulary diagnostic with its semantic offset: how far the two sides' whole
next-token distributions are apart, and whether a sampling-processing offset explains it.

One folder: ``diagnostic`` (the ``Diagnostic`` the hubs loop over; its parts are the declared
members ``diagnostics.full_vocabulary`` and ``diagnostics.semantic_offset``, its sealed file
``divergence.pt``), ``check`` (the sealed tensors and the recorded parts checked offline) and
``section`` (the report's page columns, the top token ids it has decoded and its section of a
detailed case). Its capture is ``execute.diagnostics`` (the engines hand back their full
distributions under ``RuntimeBinding.full_vocabulary``, implemented in ``runtimes/``); its
pure computation is ``numerics.full_vocabulary`` / ``numerics.semantic_offset`` /
``numerics.divergence_file`` and its run-output wording ``numerics.text``. Its config key
``$.diagnostics.full_vocabulary`` and execution-key member are ``config`` (torch-free and
typing-free, the one module this ``__init__`` imports: config loading is on ``plan``'s path).
"""

from pytest_logprob_drift.diagnostics.full_vocabulary.config import CONFIG_KEY

__all__ = ["CONFIG_KEY"]
