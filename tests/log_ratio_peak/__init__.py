"""A diagnostic defined only in the test tree: the token whose log-ratio is largest.

Installed by the test that uses it (``registry.install(DIAGNOSTIC)``), never by the package:
it shows that a diagnostic is one folder and one line, with no change to any hub. Its part
``diagnostics.log_ratio_peak`` is sealed in comparison.json beside the declared members,
checked offline against token_diffs.pt by verify, shown as a run-table column, a junit
property, a report column and a report section.
"""

from log_ratio_peak.diagnostic import DIAGNOSTIC, LogRatioPeak

__all__ = ["DIAGNOSTIC", "LogRatioPeak"]
