"""The semantic-offset diagnostic states which sampler it reproduces, per platform.

``numerics.sampling`` recomputes processed distributions by vLLM's CPU sampler's rules; on
CUDA vLLM samples with Triton top-k/top-p kernels (and, under model runner V2, its own min_p),
whose ties and thresholds may differ. Execution records that statement in the summary's
optional ``reproduces`` field: comparisons written before it read and write back unchanged,
and the offline re-check (``diagnostics.full_vocabulary.check``) compares what the sealed tensors
determine, not this execution evidence.
"""

from __future__ import annotations

import json

import pytest

from pytest_logprob_drift.numerics.comparison import Diagnostics, from_builtins
from pytest_logprob_drift.runtimes.vllm.platform import rollout_sampler
from pytest_logprob_drift.store.decode import JSONDocumentError, decode
from pytest_logprob_drift.store.files import json_bytes


def _diagnostics(document: object) -> Diagnostics:
    return from_builtins(document, Diagnostics)


OLD = {
    "fires": False,
    "explanation": None,
    "explained_fraction": 0.0,
    "truncated_positions": 0,
    "tolerance": 1e-6,
    "message": "no truncation offset: both sides put mass on the same tokens",
}


def test_each_platform_names_its_sampler() -> None:
    cpu = rollout_sampler("cpu", "v1")
    assert cpu.startswith("vLLM's CPU sampler (model runner v1")
    assert cpu.endswith("the one numerics.sampling reproduces")
    cuda_v2 = rollout_sampler("cuda", "v2")
    assert "Triton top-k/top-p kernels" in cuda_v2 and "its own min_p kernel" in cuda_v2
    assert cuda_v2.endswith(
        "not the one numerics.sampling reproduces: ties and thresholds may differ"
    )
    assert "the min_p logits processor" in rollout_sampler("cuda", "v1")


def test_old_comparisons_read_and_write_back_unchanged() -> None:
    document = {"semantic_offset": dict(OLD)}
    parsed = _diagnostics(document)
    assert parsed.semantic_offset is not None and parsed.semantic_offset.reproduces is None
    assert json.dumps(parsed.to_json(), sort_keys=True) == json.dumps(document, sort_keys=True)
    statement = {"semantic_offset": {**OLD, "reproduces": rollout_sampler("cuda", "v2")}}
    again = _diagnostics(statement)
    assert again.semantic_offset is not None
    assert again.semantic_offset.reproduces == rollout_sampler("cuda", "v2")
    assert again.to_json() == statement


@pytest.mark.parametrize("bad", [None, 3, ["cpu"]])
def test_a_reproduces_that_is_not_a_string_is_refused_by_path(bad: object) -> None:
    with pytest.raises(JSONDocumentError) as refused:
        decode(json_bytes({"semantic_offset": {**OLD, "reproduces": bad}}), Diagnostics)
    assert str(refused.value).startswith("$.semantic_offset.reproduces: Expected `str`, got ")


def test_the_offline_recheck_ignores_the_statement_but_not_the_diagnosis() -> None:
    torch = pytest.importorskip("torch")
    from pytest_logprob_drift.diagnostics.full_vocabulary.check import check_divergence
    from pytest_logprob_drift.execute.diagnostics import reproduction_statement
    from pytest_logprob_drift.numerics.divergence_file import sealed_diagnostics, sealed_tensors
    from pytest_logprob_drift.store.seal import SealError

    gen = torch.Generator().manual_seed(3)
    active = torch.tensor([[False, True, True, False], [False, True, True, True]])
    count = int(active.sum())
    rollout_full = torch.randn((count, 50), generator=gen)
    training_full = rollout_full + 0.05 * torch.randn((count, 50), generator=gen)
    training = torch.zeros(active.shape)
    rollout = torch.zeros(active.shape)
    training[active] = torch.log_softmax(training_full, -1)[:, 0]
    rollout[active] = torch.log_softmax(rollout_full, -1)[:, 0]
    tensors = sealed_tensors(rollout_full, training_full, active, top_k=3, worst_positions=2)
    entries = sealed_diagnostics(tensors, training, rollout, active)
    diffs = {"training_logprobs": training, "rollout_logprobs": rollout, "active_mask": active}
    entries["semantic_offset"]["reproduces"] = reproduction_statement(rollout_sampler("cuda", "v2"))
    check_divergence(_diagnostics(entries), tensors, diffs)  # accepted
    entries["semantic_offset"]["message"] = "edited"
    with pytest.raises(SealError, match="semantic_offset summary recomputed offline differs"):
        check_divergence(_diagnostics(entries), tensors, diffs)
