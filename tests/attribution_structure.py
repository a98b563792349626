"""Attribution's structural truths on real engines (test support): in bf16, a training-only knob
leaves the rollout side bitwise equal, a rollout-only knob leaves the training side bitwise equal
on the tokens both executions share, a knob that changes nothing is "no effect", and a rollout
that samples other tokens is compared only on the shared prefix; checked on a sealed
attribution's cases by label (``_doc``: the whole document)."""

from __future__ import annotations

from typing import Any

from pytest_logprob_drift.attribution.analysis import NO_EFFECT


def assert_structure(
    cases: dict[str, Any], *, training_only: str, rollout_only: str, no_op: str
) -> None:
    assert cases["_doc"]["noise_floor"]["rollout_max_abs_delta"] == 0.0  # CPU: run to run exact
    assert cases["_doc"]["noise_floor"]["training_max_abs_delta"] == 0.0
    training = cases[training_only]
    assert training["rollout"]["max_abs_delta"] == 0.0
    assert training["rollout"]["bitwise_equal_fraction"] == 1.0
    assert training["training"]["max_abs_delta"] > 0.0
    assert training["earliest_divergence"] is None
    assert training["classification"].startswith("moved the training side")
    rollout = cases[rollout_only]
    assert rollout["training"]["max_abs_delta"] == 0.0  # on the shared tokens
    assert rollout["rollout"]["max_abs_delta"] > 0.0
    assert "moved the rollout side" in rollout["classification"]
    if rollout["earliest_divergence"] is not None:  # other tokens: only the prefix is compared
        assert rollout["shared_tokens"] < training["shared_tokens"]
        assert rollout["classification"].startswith(
            f"changed the sampled tokens from position {rollout['earliest_divergence']}"
        )
    assert cases[no_op]["classification"] == NO_EFFECT
