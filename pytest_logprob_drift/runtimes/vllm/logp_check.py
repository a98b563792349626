"""Judging what the vLLM workers read back about their sampler: the ``logp.backend`` they run
and the dtype their LM head computes in.

Owns two pure decisions the rollout adapter reports as ``actual`` values, so that strict
execution refuses (STRICT_REJECTED, with the reason) whatever is not what was asked:

- ``injection_actual``: which ``selected_logprob`` implementation the workers' samplers ran
  for one call, from each worker's report (``rollout_logp.report``) before and after it. A
  catalog backend counts only when every TP worker installed exactly the backend, version,
  build fingerprint and factory asked for, with every site of its model runner patched (V1:
  the sampler's attributes, ``rollout_logp``; V2: the logprob functions, ``rollout_logp_v2``),
  scored exactly the rows the engine returned at the call's site, and counted no violation;
  ``native`` only when no worker's sampler carries any replaced attribute.
- ``lm_head_actual``: ``compute`` or ``float32`` from the dtype of the logits the sampler
  received (every worker the same, and equal to the ``LogitsProcessor``'s ``head_dtype``).

Pure functions over plain values: imports neither torch nor vLLM; knows nothing about cases
or comparison.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_logprob_drift.runtimes.vllm.rollout_logp import SITES, VIOLATIONS
from pytest_logprob_drift.runtimes.vllm.rollout_logp_v2 import SITES as V2_SITES

if TYPE_CHECKING:
    from pytest_logprob_drift.registry.session import KernelReference


__all__ = ["PROMPT", "SAMPLED", "injection_actual", "lm_head_actual"]

SAMPLED = "sampled_rows"
"""The site of a generate call: the sampled tokens (``Sampler.forward``)."""
PROMPT = "prompt_rows"
"""The site of a prompt-logprobs call (the prefill replay): ``gather_logprobs``."""

_PROVENANCE = ("backend", "version", "build_fingerprint", "factory")


def _count(report: Mapping[str, Any], group: str, name: str) -> int:
    values = report.get(group)
    return int(values.get(name, 0)) if isinstance(values, Mapping) else 0


def injection_actual(
    *,
    asked: str,
    reference: KernelReference | None,
    before: Sequence[Mapping[str, Any]],
    after: Sequence[Mapping[str, Any]],
    rows: int,
    site: str,
    tp_size: int,
) -> tuple[str, str]:
    """``(actual logp.backend, evidence)`` of one call that scored ``rows`` tokens at ``site``
    (``SAMPLED`` or ``PROMPT``), from every worker's injection report before and after it.
    ``actual`` equals ``asked`` only when every check holds; otherwise it names what ran
    instead, which strict execution rejects as a silent fallback with this reason."""
    if len(after) != tp_size or len(before) != tp_size:
        return (
            f"{asked} unverified: {len(before)} and {len(after)} worker report(s) before and "
            f"after the call, for tensor parallel size {tp_size}",
            "every TP worker must report its sampler",
        )
    if asked == "native":
        touched = [i for i, r in enumerate(after) if r.get("installed") or not r.get("untouched")]
        if touched:
            return (
                f"not native: worker(s) {touched} run a replaced sampler",
                "native must run vLLM's own Sampler",
            )
        return "native", f"vLLM's own Sampler on all {tp_size} worker(s) (no attribute replaced)"
    if reference is None:
        return (
            f"native (not injected: {asked} has no importable reference a vLLM worker could "
            "build its kernel from)",
            "a backend reaches a vLLM worker only by its module:attr factory",
        )
    problems: list[str] = []
    for rank, (old, new) in enumerate(zip(before, after, strict=True)):
        if new.get("error"):
            problems.append(f"worker {rank} installed nothing: {new['error']}")
            continue
        if not new.get("installed"):
            problems.append(f"worker {rank} has no backend installed")
            continue
        for key in _PROVENANCE:
            if new.get(key) != reference.get(key):
                problems.append(
                    f"worker {rank} runs {key} {new.get(key)!r}, asked {reference.get(key)!r}"
                )
        sites = list(V2_SITES if new.get("runner") == "v2" else SITES)
        if list(new.get("sites") or []) != sites:
            problems.append(f"worker {rank} patched {new.get('sites')!r}, not {sites!r}")
        scored = _count(new, "counts", site) - _count(old, "counts", site)
        if scored != rows:
            problems.append(
                f"worker {rank}'s kernel scored {scored} {site.replace('_', ' ')}, the engine "
                f"returned {rows}"
            )
        for name in VIOLATIONS:
            extra = _count(new, "violations", name) - _count(old, "violations", name)
            if extra:
                problems.append(f"worker {rank} counted {extra} {name.replace('_', ' ')}")
    if problems:
        return f"{asked} not applied: " + "; ".join(problems), "the workers' injection reports"
    first = after[0]
    return asked, (
        f"{asked} {first.get('version')} ({first.get('kernel')}) installed in the sampler of "
        f"all {tp_size} worker(s) ({first.get('model_runner')}, {first.get('sampler_class')}, "
        f"logprobs_mode {first.get('logprobs_mode')}); it scored all {rows} "
        f"{site.replace('_', ' ')} with no violation"
    )


def lm_head_actual(
    *, requested: str, model_dtype: str, compute_dtype: str, logits_dtype: str
) -> str:
    """The ``rollout.lm_head_dtype`` the workers ran: from the dtype of the logits their
    samplers received (``logits_dtype``, joined over workers and calls), which must be the
    ``LogitsProcessor``'s ``head_dtype`` (``compute_dtype``); ``float32`` when the logits are
    float32 on a model of another dtype, ``compute`` when they are the model's dtype (with a
    float32 model both hold, and the request's spelling is kept)."""
    if logits_dtype in ("", "unknown"):
        return "unobservable: the workers' samplers received no logits"
    if "," in logits_dtype:
        return f"mixed: the samplers received {logits_dtype} logits"
    if compute_dtype != logits_dtype:
        return (
            f"inconsistent: the LogitsProcessor's head_dtype is {compute_dtype} but the sampler "
            f"received {logits_dtype} logits"
        )
    if logits_dtype == model_dtype == "float32":
        return requested
    if logits_dtype == model_dtype:
        return "compute"
    return logits_dtype
