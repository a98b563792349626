"""The path split's config key ``$.diagnostics.replay`` (a boolean, named for what it asks the
rollout engine to do) and its execution-key member ``replay: true``. Torch-free and typing-free."""

from pytest_logprob_drift.diagnostics.config_flag import switch

CONFIG_KEY = switch("replay")
