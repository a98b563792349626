"""Sampling semantics: the one definition of "processed" next-token logits.

Owns the definition both transformers sides apply and the semantic-offset diagnostic
recomputes from a side's full logits (``numerics.semantic_offset``, hence below the runtimes): the
float32 logits divided by the temperature, then ``min_p``, ``top_k`` and ``top_p`` truncation
(tokens outside the kept set get ``-inf``), in the order and with the tie rules of vLLM 0.32's
CPU sampler (``Sampler.sample``: temperature, the argmax-invariant ``min_p`` processor, then
``apply_top_k_top_p_pytorch``): ``min_p`` keeps tokens with probability >= ``min_p`` times the
largest; ``top_k`` keeps every token whose logit is >= the k-th largest (ties kept); ``top_p``
sorts ascending and drops the tokens whose cumulative probability is <= ``1 - top_p`` (the
most likely token always stays). A temperature below 1e-5 is greedy: nothing is processed
(vLLM reports the raw log-softmax then). ``log_softmax`` of the result is what vLLM calls
``processed_logprobs``.

Knows nothing about engines, knobs, cases
or comparison; imports only torch and records.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from pytest_logprob_drift.records import SamplingSpec

GREEDY_EPS = 1e-5
"""vLLM's ``_SAMPLING_EPS``: a temperature below it samples greedily."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Truncation:
    """The sampler's processing of one request's logits."""

    temperature: float
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None

    @classmethod
    def of(cls, sampling: SamplingSpec) -> Truncation:
        return cls(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            min_p=sampling.min_p,
        )

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @property
    def truncates(self) -> bool:
        return not self.greedy and (
            (self.top_p is not None and self.top_p < 1.0)
            or self.top_k is not None
            or (self.min_p is not None and self.min_p > 0.0)
        )


def processed_logits(logits: Tensor, how: Truncation) -> Tensor:
    """float32 ``[..., V]``: the logits the sampler draws from (see the module docstring)."""
    out = logits.float()
    if how.greedy:
        return out.clone() if out is logits else out
    shape = out.shape
    out = out.reshape(-1, shape[-1]) / how.temperature
    if how.min_p is not None and how.min_p > 0.0:
        probs = torch.softmax(out, dim=-1)
        threshold = probs.amax(dim=-1, keepdim=True) * how.min_p
        out = out.masked_fill(probs < threshold, -float("inf"))
    if how.top_k is not None and how.top_k < out.shape[-1]:
        kth = out.topk(how.top_k, dim=-1).values[:, -1:]
        out = out.masked_fill(out < kth, -float("inf"))
    if how.top_p is not None and how.top_p < 1.0:
        ascending, order = out.sort(dim=-1, descending=False)
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        # 1 - p in float32, as vLLM computes it from its float32 ``top_p`` tensor.
        drop = cumulative <= 1 - torch.tensor(how.top_p, dtype=torch.float32)
        drop[:, -1] = False  # at least one
        ascending = ascending.masked_fill(drop, -float("inf"))
        out = out.scatter(-1, order, ascending)
    return out.reshape(shape)
