"""The ``verify`` command: re-check every seal of a run and recompute every verdict offline.

Owns printing ``store.verify``'s per-attempt statuses as a table or ``--json`` and the exit
code (1 when any attempt is invalid). Knows nothing about engines.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TextIO

from pytest_logprob_drift.cli.tables import render_table
from pytest_logprob_drift.errors import ExitCode
from pytest_logprob_drift.store.verify import verify_run


def verify_command(args: argparse.Namespace, out: TextIO) -> int:
    statuses = verify_run(Path(args.run_dir))
    bad = sum(1 for s in statuses if s.status == "invalid")
    if args.json:
        json.dump(
            {"attempts": [s.to_json() for s in statuses], "invalid": bad},
            out,
            indent=2,
            sort_keys=True,
        )
        out.write("\n")
    else:
        print(
            render_table(
                ["case_id", "attempt", "status", "outcome/file", "detail"],
                [
                    [s.case_id, s.attempt_id, s.status, s.outcome or s.file or "", s.detail]
                    for s in statuses
                ],
            ),
            file=out,
        )
        print(f"{len(statuses)} attempt(s), {bad} invalid", file=out)
    return ExitCode.UNEXPECTED_OUTCOME if bad else ExitCode.OK
