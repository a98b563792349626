"""The workers' sampling probe on both vLLM model runners, and its "saw nothing" path.

vLLM 0.32 takes a request's sampling parameters in at ``InputBatch.add_request`` under model
runner V1 (the CPU worker) and at ``Sampler.add_request`` under model runner V2 (CUDA's
default). The probe wraps both; a worker whose runner is not probed reports
``sampling_probe: False``, and a call whose requests no probe saw is reported unobservable:
a value that matches no identity, so the case is INVALID_IDENTITY naming why, instead of
being judged on the frontend's values.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from pytest_logprob_drift.runtimes.vllm.read_back import (
    model_reports,
    model_runner,
    sampling_applied,
    sampling_seen,
)

A = {"temperature": 1.0, "top_p": 0.9, "top_k": 0, "min_p": 0.05}


class _Params:
    temperature, top_p, top_k, min_p = 0.7, 0.8, 5, 0.1


class _Batch:
    """A class with the two call shapes the probe wraps (V1: a request; V2: index, params)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def add_request(self, *args: Any, **kwargs: Any) -> str:
        self.calls.append((*args, *kwargs.values()))
        return "added"


@pytest.mark.slow
def test_the_wrap_counts_each_call_shape_once_and_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pytest_logprob_drift.runtimes.vllm import worker_ext  # imports vLLM: not at collection

    seen: Counter[tuple[float, float, int, float]] = Counter()
    monkeypatch.setattr(worker_ext, "_SAMPLING_SEEN", seen)

    class V1(_Batch):
        pass

    class V2(_Batch):
        pass

    worker_ext._wrap(V1, "add_request", worker_ext._v1_params)
    worker_ext._wrap(V1, "add_request", worker_ext._v1_params)  # once only
    worker_ext._wrap(V2, "add_request", worker_ext._v2_params)
    request = type("Request", (), {"sampling_params": _Params()})()
    v1, v2 = V1(), V2()
    assert v1.add_request(request) == "added"
    assert v2.add_request(3, _Params()) == "added"
    assert v2.add_request(4, sampling_params=None) == "added"  # no params: not counted
    assert v1.calls == [(request,)]
    assert len(v2.calls) == 2
    assert seen == Counter({(0.7, 0.8, 5, 0.1): 2})


def test_a_worker_whose_runner_is_not_probed_reports_nothing_seen() -> None:
    v2_unprobed = model_reports(
        [{"sampling_probe": False, "model_runner": "v2", "sampling_seen": []}]
    )
    assert sampling_seen(v2_unprobed) == []
    assert model_runner(v2_unprobed) == "v2"
    assert model_runner(model_reports([{"vocab": {}}])) == "unknown"
    assert sampling_applied([], sampling_seen(v2_unprobed)) == {"observed": False, "values": []}


def test_saw_nothing_is_unobservable_and_the_identity_check_names_it() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from pytest_logprob_drift.numerics.verdict import identity_violations
    from pytest_logprob_drift.runtimes.vllm.adapter import UNOBSERVED_SAMPLING, _observed_truncation

    frontend = {"top_p": 0.9, "top_k": None, "min_p": 0.05}
    reported = _observed_truncation({"observed": False, "values": []}, frontend)
    assert set(reported) == {"sampling_top_p", "sampling_top_k", "sampling_min_p"}
    for value in reported.values():
        assert isinstance(value, str) and value.startswith(UNOBSERVED_SAMPLING)
        assert '"top_p": 0.9' in value  # what the frontend sent, as evidence only
    # The frontend's values are exactly what the identity asks for; they must not pass.
    expected = {"sampling_top_p": 0.9, "sampling_top_k": None, "sampling_min_p": 0.05}
    tensors = {"token_ids": torch.zeros((1, 2), dtype=torch.long)}
    problems = identity_violations(
        expected, reported, expected, tensors, tensors, readonly_violations=()
    )
    assert any(p.startswith("sampling_top_p: rollout used 'unobservable") for p in problems)
    assert any(p.startswith("sampling_min_p: rollout used 'unobservable") for p in problems)
    assert any(p.startswith("sampling_top_k: rollout 'unobservable") for p in problems)
    # ...while the values the probe saw do pass
    seen = _observed_truncation({"observed": True, "values": [A]}, frontend)
    assert seen == expected


@pytest.mark.slow
def test_vllm_0_32_has_both_probe_points_and_the_probe_wraps_them() -> None:
    pytest.importorskip("vllm")
    from vllm.v1.worker import gpu_input_batch
    from vllm.v1.worker.gpu.sample import sampler

    from pytest_logprob_drift.runtimes.vllm import worker_ext

    assert worker_ext._install_sampling_probe() == ("v1", "v2")
    assert getattr(gpu_input_batch.InputBatch.add_request, "_drift_probe", False)
    assert getattr(sampler.Sampler.add_request, "_drift_probe", False)
    assert worker_ext._install_sampling_probe() == ("v1", "v2")  # idempotent
