"""The vLLM side's per-tensor declaration (issue 59): the dtype each parameter was constructed
in, read before any weight is loaded (``vllm_layout.constructed_dtypes``), is what the side
declares; the dtype it holds is read from the tensor digested. So a router constructed in
float32 inside a bfloat16 engine is declared float32 (no dtype line), and a loader that turns
such a parameter into bfloat16 still shows as a dtype difference. No engine: a torch module
built here in a GLM4-MoE router's dtypes, "loaded" the two ways, its report written the way a
vLLM worker writes one, checked against a safetensors file written here."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from pytest_logprob_drift.runtimes import weight_push
from pytest_logprob_drift.runtimes.weights.digest import dtype_name, tensor_sha256
from pytest_logprob_drift.runtimes.weights.side_document import side_document
from pytest_logprob_drift.runtimes.weights.side_report import HeldSlice, HeldTensor, SideReport
from pytest_logprob_drift.runtimes.weights.vllm_layout import constructed_dtypes

ROUTER = "model.layers.0.mlp.gate"
WEIGHT = f"{ROUTER}.weight"
BIAS = f"{ROUTER}.e_score_correction_bias"
DOWN = "model.layers.0.mlp.shared_experts.down_proj.weight"


class _Gate(torch.nn.Module):
    """vLLM's GLM4-MoE router as constructed: ``GateLinear(params_dtype=torch.float32)`` and
    a float32 ``e_score_correction_bias`` parameter, whatever the engine's dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(4, 8, dtype=torch.float32))
        self.e_score_correction_bias = torch.nn.Parameter(torch.empty(4, dtype=torch.float32))


class _Model(torch.nn.Module):
    """A bfloat16 engine's model: the router above beside a bfloat16 linear and a float32
    buffer vLLM computes itself (no checkpoint tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = _Gate()
        self.down = torch.nn.Parameter(torch.empty(8, 8, dtype=torch.bfloat16))
        self.register_buffer("inv_freq", torch.ones(4, dtype=torch.float32), persistent=False)


VLLM_NAMES = {WEIGHT: "gate.weight", BIAS: "gate.e_score_correction_bias", DOWN: "down"}


def _checkpoint(directory: Path) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(59)
    state = {
        WEIGHT: torch.randn(4, 8, generator=generator),
        BIAS: torch.randn(4, generator=generator) * 0.5,
        DOWN: torch.randn(8, 8, generator=generator),
    }
    directory.mkdir()
    save_file(state, str(directory / "model.safetensors"))
    return state


def _report(model: _Model, declared: dict[str, str] | None) -> SideReport:
    """What one vLLM worker at TP 1 reports: every tensor as held (its dtype read from the
    tensor), and the construction's declarations in checkpoint names."""
    params = dict(model.named_parameters())
    tensors = {}
    for name, vllm_name in VLLM_NAMES.items():
        held = params[vllm_name].detach()
        digest = tensor_sha256(held)
        tensors[name] = HeldTensor(
            held=True,
            shape=tuple(held.shape),
            dtype=dtype_name(held.dtype),
            sha256=digest,
            slices=(HeldSlice(rank=0, dim=0, start=0, stop=int(held.shape[0]), sha256=digest),),
            vllm_name=vllm_name,
        )
    return SideReport(
        point="test", dtype="bfloat16", tensors=tensors, declared=dict(declared or {})
    )


def _declared_by_construction(model: _Model) -> dict[str, str]:
    built = constructed_dtypes(model, torch.bfloat16)
    return {name: built[v] for name, v in VLLM_NAMES.items() if v in built}


def _document(model_dir: Path, report: SideReport) -> list[str]:
    document = side_document(
        side="rollout",
        runtime="vllm",
        declared_dtype="bfloat16",
        report=report,
        model_dir=model_dir,
        declared=report.declared or None,
    )
    return [f"{d.name}: {d.kind}: {d.detail}" for d in document.differences]


def test_construction_declares_every_tensor_created_in_another_dtype() -> None:
    model = _Model()
    assert constructed_dtypes(model, torch.bfloat16) == {
        "gate.weight": "float32",
        "gate.e_score_correction_bias": "float32",
        "inv_freq": "float32",
    }
    assert constructed_dtypes(model, torch.float32) == {"down": "bfloat16"}
    # a parameter shared by two modules (vLLM's GLM4-MoE hands the bias to its experts) is
    # declared under each name
    model.experts = torch.nn.Module()
    model.experts.e_score_correction_bias = model.gate.e_score_correction_bias
    assert constructed_dtypes(model, torch.bfloat16)["experts.e_score_correction_bias"] == (
        "float32"
    )


def test_a_float32_router_declared_from_construction_shows_no_difference(tmp_path: Path) -> None:
    state = _checkpoint(tmp_path / "ckpt")
    model = _Model()
    declared = _declared_by_construction(model)  # before any weight is loaded
    assert declared == {WEIGHT: "float32", BIAS: "float32"}
    with torch.no_grad():  # vLLM's default weight loader: copy into the constructed storage
        for name, vllm_name in VLLM_NAMES.items():
            dict(model.named_parameters())[vllm_name].copy_(state[name])
    assert _document(tmp_path / "ckpt", _report(model, declared)) == []
    # the same report without the member (a report from before it): the old dtype lines
    assert _document(tmp_path / "ckpt", _report(model, None)) == [
        f"{BIAS}: dtype: side holds float32, declares bfloat16",
        f"{WEIGHT}: dtype: side holds float32, declares bfloat16",
    ]


def test_a_loader_that_converts_a_float32_parameter_still_shows_a_dtype_difference(
    tmp_path: Path,
) -> None:
    """The declaration is read at construction and the held dtype from the loaded tensor: a
    loader that replaces the float32 router weight by a bfloat16 one (the checkpoint's value,
    rounded) is named as a dtype difference, not declared away."""
    state = _checkpoint(tmp_path / "ckpt")
    model = _Model()
    declared = _declared_by_construction(model)
    with torch.no_grad():
        model.gate.weight.data = state[WEIGHT].to(torch.bfloat16)  # converts
        model.gate.e_score_correction_bias.copy_(state[BIAS])
        model.down.copy_(state[DOWN])
    assert _document(tmp_path / "ckpt", _report(model, declared)) == [
        f"{WEIGHT}: dtype: side holds bfloat16, declares float32"
    ]
    # read after loading instead, the declaration would follow the loader and see nothing
    assert constructed_dtypes(model, torch.bfloat16).get("gate.weight") is None


def test_a_float32_parameter_holding_bfloat16_values_is_a_value_difference(
    tmp_path: Path,
) -> None:
    """The push before issue 59's last items: every tensor cast to the rollout dtype, so the
    float32 router bias held the checkpoint's value rounded through bfloat16: declared float32
    from construction, that is a value difference (with the figures the tensor gives)."""
    state = _checkpoint(tmp_path / "ckpt")
    model = _Model()
    declared = _declared_by_construction(model)
    with torch.no_grad():
        model.gate.weight.copy_(state[WEIGHT])
        model.gate.e_score_correction_bias.copy_(state[BIAS].to(torch.bfloat16))
        model.down.copy_(state[DOWN])
    found = _document(tmp_path / "ckpt", _report(model, declared))
    assert [line.split(": ")[:2] for line in found] == [[BIAS, "values"], [BIAS, "slice"]]


@pytest.mark.parametrize("trainer", [torch.bfloat16, torch.float32])
def test_the_push_sends_each_tensor_in_the_dtype_the_engine_declares(
    trainer: torch.dtype,
) -> None:
    """``weight_push.chunks`` with the engine's declaration: the router's weight and bias in
    float32, everything else in the rollout's bfloat16; the trainer's float32 bias arrives
    bitwise. Where the trainer holds a tensor narrower than what is pushed (a bfloat16 router
    weight into vLLM's float32 one), ``pushed_through`` names the trainer's dtype (the rollout
    side's ``via``)."""
    from pytest_logprob_drift.tensorio import tensors_from_bytes

    generator = torch.Generator().manual_seed(7)
    state = {
        WEIGHT: torch.randn(4, 8, generator=generator).to(trainer),
        BIAS: torch.randn(4, generator=generator),  # kept in float32 by transformers
        DOWN: torch.randn(8, 8, generator=generator).to(trainer),
        "step": torch.tensor([3]),
    }
    held = {WEIGHT: "float32", BIAS: "float32"}
    sent: dict[str, torch.Tensor] = {}
    for chunk in weight_push.chunks(state, "bfloat16", held=held):
        sent.update(tensors_from_bytes(chunk.payload))
    assert {n: t.dtype for n, t in sent.items()} == {
        WEIGHT: torch.float32,
        BIAS: torch.float32,
        DOWN: torch.bfloat16,
        "step": torch.int64,
    }
    assert torch.equal(sent[BIAS], state[BIAS])
    assert torch.equal(sent[WEIGHT], state[WEIGHT].to(torch.float32))
    assert torch.equal(sent[DOWN], state[DOWN].to(torch.bfloat16))
    expected = {WEIGHT: "bfloat16"} if trainer == torch.bfloat16 else {}
    assert weight_push.pushed_through(state, "bfloat16", held) == expected
    # without a declaration, as before: every floating tensor in the rollout dtype
    plain: dict[str, torch.Tensor] = {}
    for chunk in weight_push.chunks(state, "bfloat16"):
        plain.update(tensors_from_bytes(chunk.payload))
    assert plain[BIAS].dtype == torch.bfloat16 and plain["step"].dtype == torch.int64
    with pytest.raises(ValueError, match="not a floating dtype"):
        list(weight_push.chunks(state, "bfloat16", held={BIAS: "int32"}))
