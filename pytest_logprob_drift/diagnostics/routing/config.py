"""The routing diagnostic's config key ``$.diagnostics.routing`` (a boolean) and its
execution-key member ``routing: true``. Torch-free and typing-free."""

from pytest_logprob_drift.diagnostics.config_flag import switch

CONFIG_KEY = switch("routing")
