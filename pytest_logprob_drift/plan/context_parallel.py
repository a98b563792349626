"""Whether a runtime can run a case's context parallelism, for the case's checkpoint.

Owns ``context_parallel_refusal``: for ``rollout.context_parallel_size`` > 1, the runtime's
declared ``ContextParallelRule`` (devices, MLA) checked against the scenario device and the
checkpoint's attention layout (``config.attention_layout``), and the one-sentence refusal that
restates the engine's rule with what the checkpoint's config.json says. Planning asks it for
``executable_by`` and the runner again before any engine starts (the checkpoint may exist by
then): a checkpoint whose layout cannot be read yet is refused with the reason, never assumed
to be one the engine can run. The knob is never mapped onto another engine setting. Knows
nothing about engines, torch or vLLM's objects.
"""

from __future__ import annotations

from collections.abc import Mapping

from pytest_logprob_drift.config.attention_layout import AttentionLayout, attention_layout
from pytest_logprob_drift.plan.knobs import value_of
from pytest_logprob_drift.records import KnobValue, RuntimeInfo

KNOB = "rollout.context_parallel_size"


def requested_size(requested: Mapping[str, KnobValue]) -> int:
    value = value_of(requested, KNOB)
    return int(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else 1


def context_parallel_refusal(
    runtime: RuntimeInfo, requested: Mapping[str, KnobValue], device: str, checkpoint: str
) -> str | None:
    """Why ``runtime`` cannot run this case's ``rollout.context_parallel_size`` on ``device``
    for ``checkpoint`` (its URI); None when the size is 1, when it can, or when the runtime
    declares no ``ContextParallelRule`` (its adapter then reports the knob unsupported)."""
    size = requested_size(requested)
    if size <= 1:
        return None
    head = f"runtime {runtime.name!r} cannot run {KNOB}={size}"
    rule = runtime.context_parallel
    if rule is None:  # the runtime declares nothing: its adapter's materialization decides
        return None
    if device not in rule.devices:
        return (
            f"{head} on {device}: it becomes {rule.setting} only on {'/'.join(rule.devices)} "
            f"({rule.rule})"
        )
    if not rule.needs_mla:
        return None
    layout = attention_layout(checkpoint, {c.uri: c for c in runtime.checkpoints})
    if isinstance(layout, AttentionLayout) and layout.mla:
        return None
    found = (
        f"{layout.describe()}"
        if isinstance(layout, AttentionLayout)
        else f"the checkpoint's attention cannot be read: {layout}"
    )
    tail = f"; {rule.not_substituted}" if rule.not_substituted else ""
    return f"{head}: {rule.rule}; {found}{tail}"
