"""Sampling semantics for the runtimes: ``pytest_logprob_drift.sampling``'s definition.

The transformers rollout and trainer (in process and in the FSDP ranks) apply the processed
logits defined there (temperature, min_p, top_k, top_p as vLLM's CPU sampler applies them);
it lives below the runtimes because the semantic-offset diagnostic recomputes the same
distribution from a side's full logits. Re-exported here, unchanged.
"""

from __future__ import annotations

from pytest_logprob_drift.sampling import GREEDY_EPS, Truncation, processed_logits

__all__ = ["GREEDY_EPS", "Truncation", "processed_logits"]
