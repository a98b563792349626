"""Attribution: which knob moved which side of the comparison, by how much, against the baseline.

``align`` pairs two executions' tokens and measures per-side movement; ``effect`` the effect on
the drift with bootstrap intervals; ``analysis`` the document of a run (noise floor,
classification, ranking); ``sealed`` the sealed artifact, its reuse and offline verification;
``text`` its rendering for terminals. Evidence beside the verdicts: it never changes one.
"""
