"""The ``verify`` command: re-check every seal of a run and recompute every verdict offline.

Owns printing ``check.verify``'s per-attempt statuses, the run's own files against their run
seals (``experiment.json``, ``plan.jsonl``), and each sealed attribution's check
(``attribution.sealed.verify_attribution``: its seal, the attempts it names, and the document
recomputed from them) as a table or ``--json``, and the exit code (1 when any attempt, run
file or attribution is invalid). Under ``--seal-key-file``/``--seal-key-env`` (made active by
the CLI) every seal must also carry a valid keyed MAC. Reads only: a read-only run verifies.
Knows nothing about engines.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TextIO

from pytest_logprob_drift.attribution.sealed import verify_attributions
from pytest_logprob_drift.check.verify import verify_run, verify_run_files
from pytest_logprob_drift.errors import ExitCode, one_line
from pytest_logprob_drift.tables import render_table


def verify_command(args: argparse.Namespace, out: TextIO) -> int:
    run_dir = Path(args.run_dir)
    statuses = verify_run(run_dir)
    run_files = verify_run_files(run_dir)
    attributions = verify_attributions(run_dir)
    bad = sum(1 for s in statuses if s.status == "invalid")
    bad += sum(1 for f in run_files if f.status == "invalid")
    bad += sum(1 for a in attributions if a["problems"])
    if args.json:
        json.dump(
            {
                "attempts": [s.to_json() for s in statuses],
                "run_files": [f.to_json() for f in run_files],
                "attributions": attributions,
                "invalid": bad,
            },
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
        for f in run_files:
            detail = f": {one_line(f.detail)}" if f.detail else ""
            print(one_line(f"run file {f.file}: {f.status}{detail}"), file=out)
        for a in attributions:
            problems = a["problems"]
            state = f"invalid: {problems[0]}" if problems else "ok (recomputed, identical)"
            if a["status"] == "superseded":
                state = "superseded (sealed without the key; a keyed one of the same inputs holds)"
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            print(one_line(f"attribution {a['attribution_id']}: {state}{more}"), file=out)
        print(
            f"{len(statuses)} attempt(s), {len(attributions)} attribution(s), {bad} invalid",
            file=out,
        )
    return ExitCode.UNEXPECTED_OUTCOME if bad else ExitCode.OK
