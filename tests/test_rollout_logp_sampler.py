"""The catalog backend inside vLLM's V1 sampler (issue 33), on a bare
``vllm.v1.sample.sampler.Sampler`` (no engine): with a backend installed the sampler samples
exactly the tokens vLLM's own does, and the sampled token's logprob is the backend's formula
on the logits each mode names, checked against a float64 computation made here (raw: the
logits as given; processed: divided by the temperature, top-p applied, as the test computes
it); the prompt-logprobs pair of calls is served too; every way the injection could be
bypassed or fed wrong is counted, and ``native`` leaves the sampler untouched.
"""

from __future__ import annotations

from typing import Any

import pytest
from drift_testing import skip_unless_installed

torch = pytest.importorskip("torch")
skip_unless_installed("vllm")
pytestmark = pytest.mark.slow  # vLLM's sampler: imports vLLM

from pytest_logprob_drift.runtimes.vllm import rollout_logp  # noqa: E402

# vLLM is imported by the tests that run (its import takes seconds), never at collection.

CHUNKED = {
    "backend": "rlkernel.chunked_logp",
    "factory": "logprob_drift_operators.selected_logprob.chunked:chunked_selected_logprob",
    "factory_style": "kernel",
    "target": "rollout",
    "options": {},
}
ROLLOUT_OFFSET = {
    "backend": "smoke_only.logp_rollout_offset",
    "factory": "pytest_logprob_drift.runtimes.smoke.kernels:build_rollout_offset_selected_logprob",
    "factory_style": "builder",
    "target": "rollout",
    "options": {},
}
ROWS, VOCAB = 6, 512


def metadata(
    rows: int, *, temperature: float, logprobs: int | None = 0, top_p: float | None = None
) -> Any:
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    return SamplingMetadata(
        temperature=None if temperature == 0 else torch.full((rows,), temperature),
        all_greedy=temperature == 0,
        all_random=temperature > 0,
        top_p=None if top_p is None else torch.full((rows,), top_p),
        top_k=None,
        generators={i: torch.Generator().manual_seed(11 + i) for i in range(rows)},
        max_num_logprobs=logprobs,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(rows),
        presence_penalties=torch.zeros(rows),
        repetition_penalties=torch.ones(rows),
        output_token_ids=[[] for _ in range(rows)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def sampler_class() -> Any:
    """vLLM's V1 ``Sampler`` (imported here, when a test runs)."""
    from vllm.v1.sample.sampler import Sampler

    return Sampler


def injected(mode: str, spec: dict[str, Any] = CHUNKED) -> Any:
    sampler = sampler_class()(logprobs_mode=mode)  # type: ignore[arg-type]
    rollout_logp.install_on_sampler(sampler, dict(spec), rollout_logp.build_kernel(spec))
    return sampler


def logits(dtype: Any) -> Any:
    return (torch.randn(ROWS, VOCAB, generator=torch.Generator().manual_seed(3)) * 4).to(dtype)


def processed64(raw: Any, temperature: float, top_p: float | None) -> Any:
    """The processed logits, computed here in float64 from the float32 upcast: temperature,
    then top-p (the smallest set of tokens whose probability reaches ``top_p``, -inf
    elsewhere)."""
    scaled = raw.float().double() / (temperature if temperature > 0 else 1.0)
    if top_p is None:
        return scaled
    probs = scaled.softmax(-1)
    order = probs.argsort(-1, descending=True)
    kept_sorted = (probs.gather(-1, order).cumsum(-1) - probs.gather(-1, order)) < top_p
    kept = torch.zeros_like(kept_sorted).scatter(-1, order, kept_sorted)
    return scaled.masked_fill(~kept, float("-inf"))


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    ("temperature", "top_p"), [(1.0, None), (0.7, None), (0.0, None), (1.0, 0.9)]
)
def test_same_tokens_and_the_backends_formula_on_the_modes_logits(
    mode: str, dtype: str, temperature: float, top_p: float | None
) -> None:
    raw = logits(getattr(torch, dtype))
    native = sampler_class()(logprobs_mode=mode)(  # type: ignore[arg-type]
        logits=raw.clone(), sampling_metadata=metadata(ROWS, temperature=temperature, top_p=top_p)
    )
    sampler = injected(mode)
    out = sampler(
        logits=raw.clone(), sampling_metadata=metadata(ROWS, temperature=temperature, top_p=top_p)
    )
    assert torch.equal(out.sampled_token_ids, native.sampled_token_ids)
    tokens = out.sampled_token_ids[:, 0].long()
    ids, values, ranks = out.logprobs_tensors[:3]
    assert torch.equal(ids[:, 0].long(), tokens) and values.dtype == torch.float32
    source = (
        raw.float().double() if mode == "raw_logprobs" else processed64(raw, temperature, top_p)
    )
    expected = source.log_softmax(-1).gather(-1, tokens[:, None])[:, 0]
    assert (values[:, 0].double() - expected).abs().max() < 2e-6
    assert torch.equal(ranks, native.logprobs_tensors.selected_token_ranks)
    report = rollout_logp.report(
        type("W", (), {"model_runner": type("R", (), {"sampler": sampler})()})()
    )
    assert report["counts"]["sampled_rows"] == ROWS
    assert not any(report["violations"].values()), report["violations"]


def test_every_token_logprob_request_keeps_vllms_row_but_the_sampled_entry() -> None:
    """``logprobs=-1`` (the full-vocabulary diagnostic): vLLM's own log-softmax of the same
    logits, with the sampled token's entry the backend's."""
    raw = logits(torch.float32)
    sampler = injected("raw_logprobs", ROLLOUT_OFFSET)
    out = sampler(
        logits=raw.clone(), sampling_metadata=metadata(ROWS, temperature=1.0, logprobs=-1)
    )
    full = out.logprobs_tensors.logprobs
    tokens = out.sampled_token_ids[:, 0].long()
    reference = raw.log_softmax(-1)
    offset = full.gather(-1, tokens[:, None])[:, 0] - reference.gather(-1, tokens[:, None])[:, 0]
    assert torch.allclose(offset, torch.full_like(offset, -0.008), atol=2e-6)
    others = torch.ones_like(full, dtype=torch.bool).scatter(-1, tokens[:, None], False)
    assert torch.equal(full[others], reference[others])


def test_the_prompt_logprobs_pair_gets_the_backends_value_on_the_raw_logits() -> None:
    raw = logits(torch.bfloat16)
    sampler = injected("processed_logprobs", ROLLOUT_OFFSET)
    targets = torch.randint(0, VOCAB, (ROWS,), generator=torch.Generator().manual_seed(5))
    scores = sampler.compute_logprobs(raw)
    ids, values = sampler.gather_logprobs(scores, 0, targets)[:2]
    expected = raw.double().log_softmax(-1).gather(-1, targets[:, None])[:, 0] - 0.008
    assert torch.equal(ids[:, 0].long(), targets)
    assert (values[:, 0].double() - expected).abs().max() < 2e-6
    state = vars(sampler)["_drift_logp"]
    assert state.counts["prompt_rows"] == ROWS
    # A gather of scores the patched compute_logprobs did not make is counted, not served.
    sampler.gather_logprobs(sampler_class().compute_logprobs(raw), 0, targets)
    assert state.counts["unpaired_gather"] == 1


def test_a_kernel_that_answers_wrongly_is_counted_and_never_passed_off() -> None:
    sampler = injected("raw_logprobs")
    state = vars(sampler)["_drift_logp"]
    state.kernel = lambda logits, ids: logits.gather(-1, ids[:, None]).double()  # float64 [N, 1]
    out = sampler(logits=logits(torch.float32), sampling_metadata=metadata(ROWS, temperature=1.0))
    assert state.counts["bad_kernel_output"] == 1
    assert bool(out.logprobs_tensors.logprobs.isnan().all())

    def broken(logits: Any, ids: Any) -> Any:
        raise RuntimeError("boom")

    state.kernel = broken
    sampler(logits=logits(torch.float32), sampling_metadata=metadata(ROWS, temperature=1.0))
    assert state.counts["kernel_error"] == 1


def test_requests_it_does_not_serve_are_counted() -> None:
    sampler = injected("raw_logprobs")
    meta = metadata(ROWS, temperature=1.0)
    meta.logprob_token_ids = {0: [1, 2]}
    sampler(logits=logits(torch.float32), sampling_metadata=meta)
    assert vars(sampler)["_drift_logp"].counts["unsupported_request"] == 1


def test_native_is_vllms_own_sampler_and_an_installed_one_says_so() -> None:
    own = sampler_class()(logprobs_mode="raw_logprobs")  # type: ignore[arg-type]
    assert rollout_logp.sampler_untouched(own)
    sampler = injected("raw_logprobs")
    assert not rollout_logp.sampler_untouched(sampler)
    assert rollout_logp.install_on_sampler(sampler, dict(CHUNKED), None) == list(rollout_logp.SITES)
    with pytest.raises(ValueError, match="already runs backend"):
        rollout_logp.install_on_sampler(sampler, dict(ROLLOUT_OFFSET), None)


def test_the_out_of_place_temperature_is_vllms_bitwise() -> None:
    raw = logits(torch.float32)
    temp = torch.linspace(0.0, 1.5, ROWS)
    for all_random in (False, True):
        t = temp.clamp(min=0.2) if all_random else temp
        kept = raw.clone()
        ours = rollout_logp.temperature_out_of_place(kept, t, all_random)
        assert torch.equal(ours, sampler_class().apply_temperature(raw.clone(), t, all_random))
        assert torch.equal(kept, raw)
