"""``python -m pytest_logprob_drift``: the CLI entry point."""

from .cli import main

raise SystemExit(main())
