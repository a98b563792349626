"""``python -m pytest_logprob_drift``: the CLI entry point."""

from pytest_logprob_drift.cli import entry

raise SystemExit(entry())
