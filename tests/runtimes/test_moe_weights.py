"""The weight check of a mixture-of-experts model on the transformers side: the expert tensors
(the checkpoint's per-expert ones and transformers 5's fused ones) are listed as skipped with
one reason, and every other tensor, the router ``mlp.gate.weight`` included, is checked
against ``hashlib`` over the safetensors file's tensors cast with plain torch (written here)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("transformers")

from pytest_logprob_drift.check.weights_check import differences
from pytest_logprob_drift.runtimes.tiny_model import TINY_MOE_ARCHITECTURES, resolve_checkpoint
from pytest_logprob_drift.runtimes.transformers.adapter import module_weights
from pytest_logprob_drift.runtimes.weights.module_digests import module_report
from pytest_logprob_drift.runtimes.weights.moe_experts import EXPERTS_NOT_CHECKED

PER_EXPERT = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")


def _sha(tensor: torch.Tensor) -> str:
    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("name", [a.name for a in TINY_MOE_ARCHITECTURES])
def test_experts_are_skipped_and_the_rest_router_included_is_checked(name: str) -> None:
    from transformers import AutoModelForCausalLM

    path = resolve_checkpoint(f"tiny://{name}", expected_digest=None).path
    stored: dict[str, torch.Tensor] = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        stored.update(load_file(str(file)))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    report = module_report(model, set(stored))
    experts = {n for n in stored if PER_EXPERT.match(n)}
    assert len(experts) == 2 * 4 * 3  # layers x experts x projections
    dense = set(stored) - experts
    assert {"model.layers.0.mlp.gate.weight", "model.layers.1.mlp.gate.weight"} <= dense
    assert set(report["tensors"]) == dense
    for tensor_name in dense:
        assert report["tensors"][tensor_name]["sha256"] == _sha(
            stored[tensor_name].to(torch.bfloat16)
        ), tensor_name
    fused = {
        f"model.layers.{i}.mlp.experts.{p}" for i in range(2) for p in ("gate_up_proj", "down_proj")
    }
    assert {n: r for n, r in report["skipped"].items() if r == EXPERTS_NOT_CHECKED}.keys() == (
        experts | fused
    )
    assert report["extra"] == {}
    document = module_weights(
        model, path, side="training", dtype="bfloat16", lm_head_dtype="bfloat16"
    )
    assert document.refused is None
    assert differences(document) == []
    assert {t.name for t in document.tensors} == dense
    assert {s.name for s in document.skipped} >= experts | fused
    # a router that no longer holds the checkpoint's values is found
    with torch.no_grad():
        model.model.layers[1].mlp.gate.weight[0, 0] += 1.0
    changed = module_weights(
        model, path, side="training", dtype="bfloat16", lm_head_dtype="bfloat16"
    )
    assert [(d.name, d.kind) for d in differences(changed)] == [
        ("model.layers.1.mlp.gate.weight", "values")
    ]
