"""A catalog ``selected_logprob`` backend inside vLLM's model runner V2 (CUDA's default in
vLLM 0.32), installed per worker process; the V2 counterpart of ``rollout_logp``.

Model runner V2 computes every logprob it returns with one function,
``vllm.v1.worker.gpu.sample.logprob.compute_token_logprobs(logits, token_ids[B, K])`` (a
chunked-logsumexp Triton kernel, float32 ``[B, K]``), reached through ``compute_topk_scores``
of the same module, which two callers import by name: the sampler (``sample.sampler``: the
sampled tokens, column 0 of ``token_ids`` being the sampled token) and the prompt-logprobs
path (``sample.prompt_logprob.compute_prompt_logprobs_with_chunking``: column 0 the prompt's
next token). ``prompt_logprob`` also imported ``compute_token_logprobs`` itself, for requests
that name their own ``logprob_token_ids``. ``install`` replaces, in this process (once, for
one spec):

- ``logprob.compute_token_logprobs``: vLLM's own result, then column 0 replaced by
  ``kernel(logits, token_ids[:, 0])`` when a known call site is active; with none active (the
  rejection sampler of speculative decoding) vLLM's own value is kept and counted as an
  ``unsupported_request``;
- ``sampler.compute_topk_scores`` and ``prompt_logprob.compute_topk_scores``: the call site
  (``sampled_rows`` / ``prompt_rows``) around vLLM's own function; a ``*_logits`` logprobs
  mode is counted (``unsupported_mode``) and a batch with custom ``logprob_token_ids`` runs
  with no site (its ``compute_token_logprobs`` call counts an ``unsupported_request``), both
  left to vLLM;
- ``prompt_logprob.compute_token_logprobs`` (the name imported by value): vLLM's own, counted
  as an ``unsupported_request`` (only custom-token-id requests reach it; the project sends
  none).

What the logits are is vLLM's: on the sampled path the raw logits (``raw_logprobs``: the LM
head's output; V2 copies them before any in-place processing) or the processed float32 logits
it sampled from (``processed_logprobs``); on the prompt path the raw logits. The targets are
resolved by import and checked to be what the callers use (``targets``; a test runs this on
CPU); the kernels themselves run only on CUDA, where this has never run here: the adapter
accepts the backend only when every worker's report shows the rows it returned scored and no
violation (``logp_check.injection_actual``). Knows nothing about cases, knobs or comparison.
"""

from __future__ import annotations

import inspect
from collections import Counter
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from pytest_logprob_drift.registry.session import KernelReference


__all__ = [
    "SITES",
    "install",
    "restore",
    "targets",
    "untouched",
]

SITES: Final = (
    "logprob.compute_token_logprobs",
    "sampler.compute_topk_scores",
    "prompt_logprob.compute_topk_scores",
    "prompt_logprob.compute_token_logprobs",
)
"""The module globals replaced in a V2 worker process."""

_MARK: Final = "_drift_logp"


def targets() -> dict[str, Any]:
    """The V2 modules whose globals ``install`` replaces, after checking vLLM 0.32's wiring:
    the sampler and the prompt-logprobs path call ``compute_topk_scores`` by a global name
    bound to ``logprob``'s, which calls ``compute_token_logprobs`` by a global name, and
    ``prompt_logprob``'s ``compute_token_logprobs`` is ``logprob``'s. ValueError naming what
    differs (a vLLM whose V2 computes logprobs elsewhere)."""
    from vllm.v1.worker.gpu.sample import logprob, prompt_logprob, sampler

    modules = {"logprob": logprob, "sampler": sampler, "prompt_logprob": prompt_logprob}
    problems = []
    for site in SITES:
        module, name = site.split(".")
        original = _original(getattr(modules[module], name, None))
        wanted = getattr(logprob, name, None)
        if original is None or original is not _original(wanted):
            problems.append(f"{site} is not vllm.v1.worker.gpu.sample.logprob.{name}")
    calls = {
        "logprob.compute_topk_scores": (
            _original(logprob.compute_topk_scores),
            "compute_token_logprobs",
        ),
        "sampler.Sampler.__call__": (_original(sampler.Sampler.__call__), "compute_topk_scores"),
        "prompt_logprob.compute_prompt_logprobs_with_chunking": (
            prompt_logprob.compute_prompt_logprobs_with_chunking,
            "compute_topk_scores",
        ),
    }
    for where, (function, name) in calls.items():
        if name not in getattr(getattr(function, "__code__", None), "co_names", ()):
            problems.append(f"{where} no longer calls {name} by its global name")
    if problems:
        raise ValueError("; ".join(problems))
    return modules


def _original(function: Any) -> Any:
    """vLLM's own function behind one of this module's wrappers (itself when unwrapped)."""
    return (
        getattr(function, "__wrapped__", function) if getattr(function, _MARK, False) else function
    )


class _State:
    """The injection of this process (one V2 worker)."""

    def __init__(self, spec: KernelReference, kernel: Any, mode: str) -> None:
        self.spec = spec
        self.kernel = kernel
        self.mode = mode
        self.counts: Counter[str] = Counter()
        self.site: str | None = None


_STATE: dict[str, _State] = {}


def state() -> _State | None:
    return _STATE.get("state")


def untouched() -> bool:
    """Whether every V2 target is vLLM's own function (nothing of this module installed)."""
    try:
        modules = targets()
    except (ImportError, ValueError):
        return False
    return not any(
        getattr(getattr(modules[s.split(".")[0]], s.split(".")[1]), _MARK, False) for s in SITES
    )


@contextmanager
def _site(current: _State, name: str | None) -> Any:
    before, current.site = current.site, name
    try:
        yield
    finally:
        current.site = before


def token_logprobs_wrapper(original: Any, current: _State, score: Any) -> Any:
    """``compute_token_logprobs`` with column 0 replaced by the kernel while a site is active
    (``score(state, logits, ids)``: float32 ``[B]`` or None, counted by the caller)."""
    import torch

    def compute_token_logprobs(logits: Any, token_ids: Any) -> Any:
        out = original(logits, token_ids)
        site = current.site
        if site is None:
            current.counts["unsupported_request"] += 1
            return out
        ids = token_ids.to(torch.int64)[:, 0]
        values = score(current, logits, ids)
        if values is None:
            values = torch.full(ids.shape, float("nan"), dtype=torch.float32, device=out.device)
        out[:, 0] = values.to(device=out.device, dtype=out.dtype)
        current.counts[site] += int(ids.shape[0])
        return out

    return _marked(compute_token_logprobs, original)


def topk_scores_wrapper(original: Any, current: _State, site: str) -> Any:
    """``compute_topk_scores`` with ``site`` active for the plain requests it serves."""

    signature = inspect.signature(original)

    def compute_topk_scores(logits: Any, num_logprobs: int, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(logits, num_logprobs, *args, **kwargs)
        bound.apply_defaults()
        custom = int(bound.arguments.get("max_per_req_token_ids") or 0)
        logits_mode = bool(bound.arguments.get("logits_mode"))
        if logits_mode or current.mode not in ("raw_logprobs", "processed_logprobs"):
            current.counts["unsupported_mode"] += 1
            return original(logits, num_logprobs, *args, **kwargs)
        if custom:  # no site: the compute_token_logprobs it reaches counts the request
            return original(logits, num_logprobs, *args, **kwargs)
        with _site(current, site):
            return original(logits, num_logprobs, *args, **kwargs)

    return _marked(compute_topk_scores, original)


def counted_wrapper(original: Any, current: _State) -> Any:
    """vLLM's own function, each call counted as an ``unsupported_request``."""

    def compute_token_logprobs(logits: Any, token_ids: Any) -> Any:
        current.counts["unsupported_request"] += 1
        return original(logits, token_ids)

    return _marked(compute_token_logprobs, original)


def _marked(wrapper: Any, original: Any) -> Any:
    wrapper.__wrapped__ = original
    setattr(wrapper, _MARK, True)
    return wrapper


def restore() -> None:
    """Put vLLM's own functions back at every site and forget the injection: a new engine built
    in this process (an engine core run in the caller's process builds engine after engine in
    one) starts with vLLM's logprobs, never the kernel an earlier engine was given."""
    if _STATE.pop("state", None) is None:
        return
    from vllm.v1.worker.gpu.sample import logprob, prompt_logprob, sampler

    modules = {"logprob": logprob, "sampler": sampler, "prompt_logprob": prompt_logprob}
    for site in SITES:
        module, name = site.split(".")
        setattr(modules[module], name, _original(getattr(modules[module], name)))


def install(spec: KernelReference, kernel: Any, mode: str, score: Any) -> list[str]:
    """Replace the V2 targets in this process for ``spec``'s ``kernel`` (``mode``: the
    sampler's ``logprobs_mode``); returns ``SITES``. Idempotent for the same spec; another
    spec already installed is a ValueError."""
    existing = state()
    if existing is not None:
        if existing.spec == spec:
            return list(SITES)
        raise ValueError(f"this worker already runs backend {existing.spec.get('backend')!r}")
    modules = targets()
    logprob, sampler, prompt = modules["logprob"], modules["sampler"], modules["prompt_logprob"]
    current = _State(spec, kernel, mode)
    topk = logprob.compute_topk_scores
    token = logprob.compute_token_logprobs
    logprob.compute_token_logprobs = token_logprobs_wrapper(token, current, score)
    sampler.compute_topk_scores = topk_scores_wrapper(topk, current, "sampled_rows")
    prompt.compute_topk_scores = topk_scores_wrapper(topk, current, "prompt_rows")
    prompt.compute_token_logprobs = counted_wrapper(token, current)
    _STATE["state"] = current
    return list(SITES)
