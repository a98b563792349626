"""Tests whose expectations must hold on any CPU (issue 14, class 8).

The smoke scorer computes one matrix product per sequence, so a sample's training scores are
bitwise the same whatever the batch size: ``batch.size`` cases may be asserted to have no
effect at all, on any CPU, whatever kernels its BLAS picks for other shapes. (Expected values
that depend on float rounding, such as which token is worst, are derived from the sealed data
instead: see ``tests/test_plugin.py``'s ``worst_token_line``.)
"""

from __future__ import annotations

import torch
from drift_testing import S0

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.execute.protocol import bind_case
from pytest_logprob_drift.policy import assemble
from pytest_logprob_drift.runtimes.smoke.runtime import StatelessScorer, SyntheticRollout


def test_smoke_scores_are_bitwise_independent_of_the_batch_size() -> None:
    execution_plan = plan_file(str(S0), catalog=assemble().operators)
    plan = execution_plan.plan
    ec = execution_plan.cases[0]
    binding = bind_case(ec, runtime_kind="cpu-smoke", identity=plan.identity, device="cpu")
    rollout = SyntheticRollout(binding).generate(plan.identity, batch_size=1, logp=None)
    scorer = StatelessScorer(binding)
    scores = [
        scorer.score(plan.identity, rollout.tensors, batch_size=size, logp=None).logprobs
        for size in (1, 2, 3, 4, 16)
    ]
    for other in scores[1:]:
        assert torch.equal(scores[0].view(torch.int32), other.view(torch.int32))
    chunked = SyntheticRollout(binding).generate(plan.identity, batch_size=3, logp=None)
    for name, tensor in rollout.tensors.items():
        assert torch.equal(tensor, chunked.tensors[name]), name
