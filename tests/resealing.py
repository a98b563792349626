"""Re-sealing a run directory the way anyone who can write an unkeyed run can (test support).

``reseal`` recomputes every plain SHA-256 seal that covers a rewritten file, from the seal
format the README documents and nothing of the package: an attempt's or attribution's
``COMPLETE`` (``files``: name -> digest), an attribution's ``inputs`` (the digest of each
attempt's ``COMPLETE``, in its seal and in its document alike), and the run seal
``seals/run-<bytes>.json`` of ``experiment.json`` and ``plan.jsonl``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_json(path: Path, document: Any) -> None:
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")


def reseal(run_dir: Path, changed: Path) -> None:
    """Recompute every plain SHA-256 seal that covers ``changed`` (the documented format:
    ``COMPLETE`` maps each file of its directory to its digest; an attribution's ``COMPLETE``
    also names the digest of each attempt's ``COMPLETE`` in ``inputs``, as its document does;
    ``seals/run-<bytes>.json`` holds the digest of experiment.json and of plan.jsonl's first
    ``<bytes>`` bytes), as anyone who can write an unkeyed run can."""
    if changed.parent.parent.parent.name == "cases" and changed.name != "COMPLETE":
        _reseal_directory(changed.parent, changed.name)
    if changed.parent.parent.parent.name == "cases":
        _reseal_attributions(run_dir, changed.parent)
    if changed.parent.parent.name == "attributions" and changed.name != "COMPLETE":
        _reseal_directory(changed.parent, changed.name)
    if changed.parent == run_dir:
        for seal in (run_dir / "seals").iterdir():
            seal.unlink()
        plan = (run_dir / "plan.jsonl").read_bytes()
        _write_json(
            run_dir / "seals" / f"run-{len(plan):012d}.json",
            {
                "experiment.json": _sha256(run_dir / "experiment.json"),
                "plan.jsonl": {"bytes": len(plan), "sha256": hashlib.sha256(plan).hexdigest()},
            },
        )


def _reseal_directory(directory: Path, name: str) -> None:
    manifest = json.loads((directory / "COMPLETE").read_text())
    manifest["files"][name] = _sha256(directory / name)
    _write_json(directory / "COMPLETE", manifest)


def _reseal_attributions(run_dir: Path, attempt: Path) -> None:
    digest = _sha256(attempt / "COMPLETE")
    if not (run_dir / "attributions").is_dir():  # an imported run has none
        return
    for attribution in (run_dir / "attributions").iterdir():
        seal = json.loads((attribution / "COMPLETE").read_text())
        document = json.loads((attribution / "attribution.json").read_text())
        for holder in (seal, document):
            for reference in holder["inputs"]:
                if reference["attempt_id"] == attempt.name:
                    reference["complete_sha256"] = digest
        _write_json(attribution / "attribution.json", document)
        seal["files"]["attribution.json"] = _sha256(attribution / "attribution.json")
        _write_json(attribution / "COMPLETE", seal)
