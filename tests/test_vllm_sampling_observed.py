"""min_p (with top_p, top_k) observed on a running vLLM engine: the pure halves.

The worker probe counts the ``SamplingParams`` of every request its input batch takes in; the
rollout compares two snapshots around one ``generate`` and reports what those requests ran
with (several distinct values read as ``mixed``, which matches no identity; nothing observed
is unobservable, never the frontend's params: ``tests/test_gpu_sampling_probe.py``). The
engine half is in ``tests/runtimes/test_rollout_lm_head.py``.
"""

from __future__ import annotations

import msgspec
import pytest

from pytest_logprob_drift.runtimes.vllm.read_back import (
    model_reports,
    sampling_applied,
    sampling_seen,
)

A = {"temperature": 1.0, "top_p": 0.9, "top_k": 0, "min_p": 0.05}
B = {"temperature": 1.0, "top_p": 1.0, "top_k": 5, "min_p": 0.0}


def test_sampling_seen_reads_the_probe_of_the_first_worker_that_runs_it() -> None:
    assert sampling_seen(model_reports([{"vocab": {}}])) == []
    unprobed = {"sampling_probe": False, "sampling_seen": [{**A, "requests": 1}]}
    assert sampling_seen(model_reports([unprobed])) == []
    reports = [{"sampling_probe": True, "sampling_seen": [{**A, "requests": 4}]}]
    assert sampling_seen(model_reports(reports)) == [{**A, "requests": 4}]


@pytest.mark.parametrize(
    ("report", "path"),
    [
        ({"sampling_seen": [{**A, "requests": -1}]}, "$.sampling_seen[0].requests"),
        ({"sampling_seen": [{**A}]}, "$.sampling_seen[0]"),
        ({"vocab": {"lm_head": {"tp_rank": 0}}}, "$.vocab[...]"),
        ({"attention_backends": "TorchSDPA"}, "$.attention_backends"),
        ({"sampling_probe": "yes"}, "$.sampling_probe"),
    ],
)
def test_a_worker_report_of_another_shape_is_refused_naming_its_member(
    report: dict[str, object], path: str
) -> None:
    with pytest.raises(msgspec.ValidationError) as refused:
        model_reports([report])
    assert str(refused.value).endswith(f"at `{path}`")


def test_sampling_applied_is_what_entered_between_two_snapshots() -> None:
    before = [{**A, "requests": 4}]
    assert sampling_applied(before, before) == {"observed": False, "values": []}
    after = [{**A, "requests": 8}, {**B, "requests": 1}]
    assert sampling_applied(before, after) == {"observed": True, "values": [A, B]}
    assert sampling_applied([], [{**A, "requests": 2}]) == {"observed": True, "values": [A]}


def test_observed_truncation_reports_the_workers_values() -> None:
    pytest.importorskip("transformers")
    from pytest_logprob_drift.runtimes.vllm.adapter import _observed_truncation

    frontend = {"top_p": 0.5, "top_k": None, "min_p": None}
    one = _observed_truncation({"observed": True, "values": [A]}, frontend)
    assert one == {"sampling_top_p": 0.9, "sampling_top_k": None, "sampling_min_p": 0.05}
    mixed = _observed_truncation({"observed": True, "values": [A, B]}, frontend)
    assert all(str(v).startswith("mixed: ") for v in mixed.values())
