"""A catalog ``selected_logprob`` backend inside vLLM's V1 sampler (``logp.backend`` on the
rollout side), installed per worker, and what each worker reads back about it.

Owns ``install`` (on a worker's model runner) and ``install_on_sampler`` (on one
``vllm.v1.sample.sampler.Sampler``): the kernel is rebuilt in the worker from its reference
(``module:attr``, a builder called with ``target="rollout"`` and the case's options), and the
sampled token's logprob, and the prompt token's logprob of a prompt-logprobs request, become
``kernel(logits, token_ids)`` computed from vLLM's own logits:

- ``Sampler.forward`` (the sampled tokens): vLLM samples as it always does, asked for no
  logprobs (``max_num_logprobs=None``), so its own log-softmax never runs; the kernel then
  receives, per ``logprobs_mode``, the **raw** logits the model produced (the LM head's output
  dtype: the model's dtype, float32 under ``head_dtype=float32``; before any processing;
  a float32 tensor is cloned first, because vLLM divides it by the temperature in place) or
  the **processed** logits vLLM sampled from (float32, after the logits processors,
  penalties, temperature, min_p and top-k/top-p, -inf outside the kept support; captured
  where vLLM applies top-k/top-p, ``TopKTopPSampler.forward``, or, when every request of the
  batch is greedy, where ``Sampler.sample`` receives them). With ``logprobs=0`` (what the
  rollout asks) only the sampled token's logprob and rank are built; with ``logprobs=-1`` or
  ``k > 0`` vLLM's own full log-softmax of the same logits is built and the sampled token's
  entry replaced by the kernel's value.
- the prompt-logprobs path (``GPUModelRunner._get_prompt_logprobs_dict``: ``compute_logprobs``
  then ``gather_logprobs`` through the runner's sampler): vLLM computes its scores as always
  and the target token's column is replaced by the kernel's value on the same **raw** logits
  (vLLM applies no sampling processor to prompt tokens, in either mode).

``native`` installs nothing: the sampler stays vLLM's own class attributes, which
``sampler_untouched`` reads back. Every assumption is counted and read back rather than
trusted (``report``): rows the kernel scored per call site, and each violation (a gather whose
scores the patched ``compute_logprobs`` did not produce, logits modified in place before the
kernel read them, processed logits not captured, a kernel result of the wrong shape or dtype,
a logprobs mode or request kind the injection does not serve, a kernel error); the rollout
adapter refuses the case (STRICT_REJECTED) unless every worker installed what was asked and
counted exactly the rows the engine returned with no violation.

Tensor parallelism: vLLM's ``LogitsProcessor`` all-gathers the logits over the TP ranks before
the sampler (``current_platform.use_all_gather()``), and every rank runs the sampler on the full
``[N, V]`` logits; the kernel therefore sees the whole vocabulary on every rank (read back as
``sampler_logits_width``), and rank 0's result is what the engine returns.

Imported inside vLLM worker processes (and by tests and the benchmark, on a bare ``Sampler``);
knows nothing about cases, knobs or comparison.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
from collections import Counter
from typing import TYPE_CHECKING, Any, Final, TypedDict

if TYPE_CHECKING:
    import torch

    from pytest_logprob_drift.registry.session import KernelReference


__all__ = [
    "MODES",
    "SITES",
    "VIOLATIONS",
    "build_kernel",
    "install",
    "install_on_sampler",
    "observe_logits",
    "report",
    "sampler_untouched",
]

MODES: Final = ("raw_logprobs", "processed_logprobs")
"""The ``logprobs_mode`` values the injection serves (the ones the project builds engines with)."""

SITES: Final = (
    "Sampler.forward",
    "Sampler.apply_temperature",
    "TopKTopPSampler.forward",
    "Sampler.sample",
    "Sampler.compute_logprobs",
    "Sampler.gather_logprobs",
)
"""The attributes replaced on the runner's sampler instance (and its top-k/top-p sampler)."""

VIOLATIONS: Final = (
    "unpaired_gather",
    "logits_modified",
    "processed_missing",
    "bad_kernel_output",
    "unsupported_mode",
    "unsupported_request",
    "kernel_error",
)
"""What the injection counts instead of silently returning vLLM's own value."""

_PATCHED: Final = (
    "forward",
    "sample",
    "apply_temperature",
    "compute_logprobs",
    "gather_logprobs",
)


class _State:
    """The injection of one sampler (one per worker)."""

    def __init__(self, spec: KernelReference, kernel: Any) -> None:
        self.spec = spec
        self.kernel = kernel
        self.counts: Counter[str] = Counter()
        self.processed: Any = None
        self.pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        """The last ``compute_logprobs`` call's scores, logits and logits snapshot, until the
        ``gather_logprobs`` that pairs with it."""


def build_kernel(spec: KernelReference) -> Any:
    """The kernel named by ``spec`` (``factory``: ``module:attr``; ``factory_style``
    ``builder``: called with ``target`` and ``options``)."""
    from pytest_logprob_drift.references import resolve_reference

    obj = resolve_reference(str(spec["factory"]))
    if spec.get("factory_style") == "builder":
        obj = obj(target=str(spec.get("target", "rollout")), options=dict(spec.get("options", {})))
    if not callable(obj):
        raise TypeError(f"{spec['factory']} did not give a callable kernel")
    return obj


def _source_sha256(obj: Any) -> str:
    """SHA-256 of the source file of the module the kernel's code lives in (``unknown`` when
    it has none)."""
    target = getattr(obj, "__wrapped__", obj)
    try:
        path = inspect.getsourcefile(target)
    except TypeError:
        path = None
    if not path:
        return "unknown"
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def sampler_untouched(sampler: Any) -> bool:
    """Whether ``sampler`` (and its top-k/top-p sampler's ``forward``) is vLLM's own: no
    attribute this module replaces is set on the instance."""
    own = vars(sampler)
    if any(name in own for name in _PATCHED) or "_drift_logp" in own:
        return False
    topk = getattr(sampler, "topk_topp_sampler", None)
    forward = vars(topk).get("forward") if topk is not None else None
    return not getattr(forward, "_drift_logp", False)


_PROBE_COLUMNS: Final = 64


def _snapshot(logits: Any) -> Any:
    """A copy of ``_PROBE_COLUMNS`` evenly spaced columns of ``logits``: vLLM's workers run
    under ``torch.inference_mode``, whose tensors keep no version counter, so an in-place
    write into logits the kernel still has to read is detected by comparing these columns
    (a cheap probe, not a proof: the writes vLLM is known to make are kept off the logits)."""
    step = max(1, int(logits.shape[-1]) // _PROBE_COLUMNS)
    return logits[..., ::step].clone()


def _unchanged(logits: Any, snapshot: Any) -> bool:
    import torch

    step = max(1, int(logits.shape[-1]) // _PROBE_COLUMNS)
    return bool(torch.equal(logits[..., ::step], snapshot))


def _check_kernel_output(state: _State, values: Any, rows: int) -> Any:
    import torch

    if (
        not isinstance(values, torch.Tensor)
        or values.dtype != torch.float32
        or tuple(values.shape) != (rows,)
    ):
        state.counts["bad_kernel_output"] += 1
        return None
    return values


def _score(state: _State, logits: Any, token_ids: Any) -> Any:
    """``kernel(logits, token_ids)`` as float32 ``[rows]``, or None (counted) when the kernel
    failed or returned something else."""
    try:
        values = state.kernel(logits, token_ids)
    except Exception:  # counted and read back: the case is refused, the engine lives on
        state.counts["kernel_error"] += 1
        return None
    return _check_kernel_output(state, values, int(token_ids.shape[0]))


def temperature_out_of_place(logits: Any, temp: Any, all_random: bool) -> Any:
    """vLLM's ``Sampler.apply_temperature`` written out of place: the same division into a new
    tensor, so the raw logits the kernel reads afterwards are not divided in place (vLLM's
    ``.to(float32)`` hands the sampler the model's own float32 logits). ``install_on_sampler``
    checks it bitwise against vLLM's own on a probe before installing it."""
    import torch

    if not all_random:
        temp = torch.where(temp < _SAMPLING_EPS, 1.0, temp)
    return logits.div(temp.unsqueeze(dim=1))


_SAMPLING_EPS: Final = 1e-5
"""vLLM 0.32's ``vllm.v1.sample.sampler._SAMPLING_EPS`` (checked at install)."""


def _check_temperature(cls: Any, module: Any) -> None:
    """ValueError unless ``temperature_out_of_place`` equals vLLM's ``apply_temperature``
    bitwise on a probe (greedy and random rows) and leaves its input unchanged."""
    import torch

    if getattr(module, "_SAMPLING_EPS", None) != _SAMPLING_EPS:
        raise ValueError("vLLM's _SAMPLING_EPS is not the one this injection was written for")
    probe = torch.randn(4, 37, generator=torch.Generator().manual_seed(0))
    temp = torch.tensor([0.0, 0.7, 1.0, 1.3])
    for all_random in (False, True):
        t = temp if not all_random else temp.clamp(min=0.5)
        theirs = cls.apply_temperature(probe.clone(), t, all_random)
        kept = probe.clone()
        ours = temperature_out_of_place(kept, t, all_random)
        if not torch.equal(theirs, ours) or not torch.equal(kept, probe):
            raise ValueError("vLLM's Sampler.apply_temperature differs from the out-of-place copy")


def install_on_sampler(sampler: Any, spec: KernelReference, kernel: Any) -> list[str]:
    """Replace the selected-logprob computation of ``sampler`` (a V1 ``Sampler``) by
    ``kernel``; returns the sites patched (``SITES``). Idempotent for the same spec; a sampler
    that already carries another injection is a ValueError."""
    import torch
    from vllm.v1.outputs import LogprobsTensors
    from vllm.v1.sample import sampler as sampler_module
    from vllm.v1.sample.ops import logprobs as count_module
    from vllm.v1.sample.ops import topk_topp_sampler as topk_module

    existing = vars(sampler).get("_drift_logp")
    if existing is not None:
        if existing.spec == spec:
            return list(SITES)
        raise ValueError(f"this sampler already runs backend {existing.spec.get('backend')!r}")
    state = _State(spec, kernel)
    cls = sampler_module.Sampler
    _check_temperature(cls, sampler_module)
    original_forward = sampler.forward
    original_sample = sampler.sample
    topk = sampler.topk_topp_sampler
    original_topk = topk.forward

    def topk_forward(logits: Any, generators: Any, k: Any, p: Any) -> Any:
        # vLLM's own top-k/top-p, then vLLM's own sampling of exactly those logits.
        processed = topk_module.apply_top_k_top_p(logits, k, p)
        state.processed = (processed, _snapshot(processed))
        return original_topk(processed, generators, None, None)

    topk_forward._drift_logp = True  # type: ignore[attr-defined]

    def sample(logits: Any, sampling_metadata: Any, logprobs_mode_override: Any = None) -> Any:
        state.processed = (logits, _snapshot(logits)) if sampling_metadata.all_greedy else None
        return original_sample(logits, sampling_metadata, logprobs_mode_override)

    def forward(
        logits: Any,
        sampling_metadata: Any,
        predict_bonus_token: bool = False,
        logprobs_mode_override: Any = None,
    ) -> Any:
        wanted = sampling_metadata.max_num_logprobs
        if wanted is None and not sampling_metadata.logprob_token_ids:
            return original_forward(
                logits, sampling_metadata, predict_bonus_token, logprobs_mode_override
            )
        mode = logprobs_mode_override or sampler.logprobs_mode
        if mode not in MODES or sampling_metadata.logprob_token_ids or predict_bonus_token:
            state.counts["unsupported_mode" if mode not in MODES else "unsupported_request"] += 1
            return original_forward(
                logits, sampling_metadata, predict_bonus_token, logprobs_mode_override
            )
        raw = None
        if mode == "raw_logprobs":
            # vLLM upcasts with .to(float32), the same tensor when it is float32 already; the
            # temperature is divided out of place (``temperature_out_of_place``); what else
            # writes into the logits in place (allowed-token masks, bad words, penalties) is
            # kept off them by a copy, and anything left shows in a probe of its columns
            # (``_snapshot``).
            in_place = (
                sampling_metadata.allowed_token_ids_mask is not None
                or bool(sampling_metadata.bad_words_token_ids)
                or not sampling_metadata.no_penalties
            )
            raw = logits.clone() if in_place and logits.dtype == torch.float32 else logits
            raw_snapshot = _snapshot(raw)
        state.processed = None
        out = original_forward(
            logits,
            dataclasses.replace(sampling_metadata, max_num_logprobs=None),
            predict_bonus_token,
            logprobs_mode_override,
        )
        sampled = out.sampled_token_ids[:, 0].long()
        if raw is not None:
            source = raw
            if not _unchanged(raw, raw_snapshot):
                state.counts["logits_modified"] += 1
        else:
            captured, state.processed = state.processed, None
            if captured is None:
                state.counts["processed_missing"] += 1
                source = logits.to(torch.float32)
            else:
                source, snapshot = captured
                if not _unchanged(source, snapshot):
                    state.counts["logits_modified"] += 1
        values = _score(state, source, sampled)
        if values is None:
            values = torch.full(sampled.shape, float("nan"), dtype=torch.float32)
        state.counts["sampled_rows"] += int(sampled.shape[0])
        if wanted == 0:
            # vLLM's rank (tokens at least as likely as the sampled one), counted on the logits
            # the kernel read, with vLLM's own compiled count.
            selected = source.gather(-1, sampled.unsqueeze(-1))
            torch._dynamo.decorators.mark_unbacked(source, 0)
            torch._dynamo.decorators.mark_unbacked(selected, 0)
            tensors = LogprobsTensors(
                sampled.unsqueeze(-1).to(torch.int32),
                values.unsqueeze(-1),
                count_module.batched_count_greater_than(source, selected),
            )
        else:
            full = cls.compute_logprobs(source)
            full.scatter_(-1, sampled.unsqueeze(-1), values.unsqueeze(-1))
            if wanted == -1:
                tensors = LogprobsTensors(torch.empty(0), full, torch.empty(0))
            else:
                tensors = cls.gather_logprobs(full, wanted, token_ids=sampled)
        return dataclasses.replace(out, logprobs_tensors=tensors)

    def compute_logprobs(logits: Any) -> Any:
        scores = cls.compute_logprobs(logits)
        state.pending = (scores, logits, _snapshot(logits))
        return scores

    def gather_logprobs(logprobs: Any, num_logprobs: int, token_ids: Any) -> Any:
        gathered = cls.gather_logprobs(logprobs, num_logprobs, token_ids)
        pending, state.pending = state.pending, None
        if pending is None or pending[0] is not logprobs:
            state.counts["unpaired_gather"] += 1
            return gathered
        _, logits, snapshot = pending
        if not _unchanged(logits, snapshot):
            state.counts["logits_modified"] += 1
        values = _score(state, logits, token_ids.long())
        if values is None:
            values = torch.full(token_ids.shape, float("nan"), dtype=torch.float32)
        gathered.logprobs[:, 0] = values.to(gathered.logprobs.dtype)
        state.counts["prompt_rows"] += int(token_ids.shape[0])
        return gathered

    topk.forward = topk_forward
    if mode_is_processed(sampler):
        # The processed logprobs are the kernel's now: vLLM's own log-softmax of them would
        # be computed and thrown away.
        topk.logprobs_mode = "raw_logprobs"
    sampler.sample = sample
    sampler.apply_temperature = temperature_out_of_place
    sampler.forward = forward
    sampler.compute_logprobs = compute_logprobs
    sampler.gather_logprobs = gather_logprobs
    sampler._drift_logp = state
    return list(SITES)


def mode_is_processed(sampler: Any) -> bool:
    return str(sampler.logprobs_mode) == "processed_logprobs"


@dataclasses.dataclass
class _LogitsSeen:
    """What the sampler of this worker received (``_observe_logits``): dtypes and the last width."""

    dtypes: Counter[str] = dataclasses.field(default_factory=Counter)
    width: int | None = None


_LOGITS_SEEN = _LogitsSeen()


class LogitsSeen(TypedDict):
    """The logits this worker's sampler received, as ``model_report`` carries them."""

    sampler_logits_dtypes: list[str]
    sampler_logits_width: int | None


class LogpReport(TypedDict, total=False):
    """What this worker's sampler runs (``report``); ``error`` when an install put nothing in."""

    model_runner: str
    runner: str
    sampler_class: str
    logprobs_mode: str
    untouched: bool
    installed: bool
    backend: str
    version: str
    build_fingerprint: str
    factory: str
    kernel: str
    kernel_source_sha256: str
    sites: list[str]
    counts: dict[str, int]
    violations: dict[str, int]
    error: str


def observe_logits(sampler: Any) -> None:
    """A forward pre-hook (once) on the runner's sampler that records the dtype and vocabulary
    width of the logits it receives: the LM head's output, read back for
    ``rollout.lm_head_dtype``. Observation only: vLLM's code runs unchanged."""
    if getattr(sampler, "_drift_logits_observed", False):
        return

    def hook(_module: Any, args: Any, kwargs: Any) -> None:
        logits = kwargs.get("logits") if "logits" in kwargs else (args[0] if args else None)
        if logits is not None:
            _LOGITS_SEEN.dtypes[str(logits.dtype).removeprefix("torch.")] += 1
            _LOGITS_SEEN.width = int(logits.shape[-1])

    if hasattr(sampler, "register_forward_pre_hook"):  # V1's Sampler is a torch Module
        sampler.register_forward_pre_hook(hook, with_kwargs=True)
    else:  # V2's Sampler is a plain class called as sampler(logits, input_batch)
        cls = type(sampler)
        original = cls.__call__
        if not getattr(original, "_drift_logits_observed", False):

            def observed(self: Any, *args: Any, **kwargs: Any) -> Any:
                hook(self, args, kwargs)
                return original(self, *args, **kwargs)

            observed._drift_logits_observed = True  # type: ignore[attr-defined]
            cls.__call__ = observed
    sampler._drift_logits_observed = True


def forget_logits_seen() -> None:
    """Start the record of the logits received afresh (a new engine built in this process)."""
    _LOGITS_SEEN.dtypes.clear()
    _LOGITS_SEEN.width = None


def logits_seen() -> LogitsSeen:
    return {
        "sampler_logits_dtypes": sorted(_LOGITS_SEEN.dtypes),
        "sampler_logits_width": _LOGITS_SEEN.width,
    }


def install(worker: Any, spec: KernelReference) -> LogpReport:
    """Install ``spec``'s kernel in this worker's sampler; returns ``report(worker)`` with
    ``error`` set when nothing was installed (a sampler of another class, a kernel that cannot
    be built here). Model runner V1: the sampler instance's attributes (``install_on_sampler``);
    model runner V2: the module functions its sampler and prompt-logprobs path compute
    logprobs with (``rollout_logp_v2``)."""
    runner = getattr(worker, "model_runner", None)
    if bool(getattr(worker, "use_v2_model_runner", False)):
        return _install_v2(worker, runner, spec)
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    error = None
    if not isinstance(runner, GPUModelRunner):
        error = (
            f"model runner {type(runner).__name__} is not vLLM's V1 GPUModelRunner (or its CPU "
            "subclass), whose Sampler the injection patches"
        )
    elif type(runner.sampler) is not Sampler:
        error = f"the runner's sampler is {type(runner.sampler).__name__}, not vLLM's V1 Sampler"
    else:
        try:
            kernel = build_kernel(spec)
            install_on_sampler(runner.sampler, spec.copy(), kernel)
        except Exception as exc:  # reported; the adapter refuses the case
            error = f"{type(exc).__name__}: {exc}"
    return _with_error(report(worker), error)


def _install_v2(worker: Any, runner: Any, spec: KernelReference) -> LogpReport:
    from vllm.v1.worker.gpu.sample.sampler import Sampler as V2Sampler

    from pytest_logprob_drift.runtimes.vllm import rollout_logp_v2

    sampler = getattr(runner, "sampler", None)
    error = None
    if type(sampler) is not V2Sampler:
        error = (
            f"the V2 runner's sampler is {type(sampler).__name__}, not vLLM's V2 Sampler "
            "(a watermark or model-specific sampler)"
        )
    else:
        try:
            kernel = build_kernel(spec)
            rollout_logp_v2.install(spec.copy(), kernel, str(sampler.logprobs_mode), _score)
        except Exception as exc:  # reported; the adapter refuses the case
            error = f"{type(exc).__name__}: {exc}"
    return _with_error(report(worker), error)


def _with_error(report: LogpReport, error: str | None) -> LogpReport:
    """``report`` with ``error`` set when an install put nothing in."""
    if error:
        report["error"] = error
    return report


def _runner_kind(worker: Any) -> str:
    return "v2" if bool(getattr(worker, "use_v2_model_runner", False)) else "v1"


def report(worker: Any) -> LogpReport:
    """What this worker's sampler runs: the installed backend and its provenance, the sites
    patched, the model runner (its class and ``runner``: ``v1``/``v2``), the counters, and
    whether the sampler is vLLM's own."""
    runner = getattr(worker, "model_runner", None)
    sampler = getattr(runner, "sampler", None)
    kind = _runner_kind(worker)
    if kind == "v2":
        from pytest_logprob_drift.runtimes.vllm import rollout_logp_v2

        state = rollout_logp_v2.state()
        sites = list(rollout_logp_v2.SITES)
        untouched = rollout_logp_v2.untouched()
    else:
        state = vars(sampler).get("_drift_logp") if sampler is not None else None
        sites = list(SITES)
        untouched = sampler is not None and sampler_untouched(sampler)
    base: LogpReport = {
        "model_runner": type(runner).__name__,
        "runner": kind,
        "sampler_class": type(sampler).__name__,
        "logprobs_mode": str(getattr(sampler, "logprobs_mode", "")),
        "untouched": untouched,
    }
    if state is None:
        return {**base, "installed": False}
    counts = {name: int(state.counts[name]) for name in ("sampled_rows", "prompt_rows")}
    return {
        **base,
        "installed": True,
        "backend": state.spec.get("backend"),
        "version": state.spec.get("version"),
        "build_fingerprint": state.spec.get("build_fingerprint"),
        "factory": state.spec.get("factory"),
        "kernel": f"{getattr(state.kernel, '__module__', '?')}."
        f"{getattr(state.kernel, '__qualname__', type(state.kernel).__name__)}",
        "kernel_source_sha256": _source_sha256(state.kernel),
        "sites": sites,
        "counts": counts,
        "violations": {name: int(state.counts[name]) for name in VIOLATIONS},
    }
