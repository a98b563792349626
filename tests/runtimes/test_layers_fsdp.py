"""Layer diagnostics in the FSDP rank processes (issue 23): a real bf16 experiment on the deep
tiny Qwen3 (8 decoder layers) whose baseline trainer is FSDP-sharded over two gloo rank
processes, run twice through the CLI with ``diagnostics.layers`` on and off.

The cases: the FSDP baseline, ``training.sharding=none`` (the in-process trainer) and
``training.lm_head_dtype=float32`` (a float32 head under FSDP: the ranks' capture must see the
recomputed float32 logits). Everything claimed is checked against computations written here:
the FSDP side's digests and norms against states captured by hooks written here on a plain
transformers model, bitwise exactly where the sealed unsharded capture shows FSDP to be
bitwise equal to the unsharded model on this machine (derived from the two sealed captures,
never assumed), and against the float32 tolerance of each state's norm otherwise.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import DEEP, DEEP_SMALL, cli, experiment_config
from layer_hooks import digests16, hooked_states, scoring_rows

from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint
from pytest_logprob_drift.runtimes.transformers import fsdp, fsdp_rank
from pytest_logprob_drift.runtimes.transformers import fsdp_messages as wire
from pytest_logprob_drift.tensorio import tensor_bytes

TRAINING, ROLLOUT = "layers_training.pt", "layers_rollout.pt"
STATES = [*(str(k) for k in range(9)), "final_norm", "logits"]
UNSHARDED, HEAD = "training.sharding=none", "training.lm_head_dtype=float32"
LABELS = {"baseline", UNSHARDED, HEAD}
F32_EPS = torch.finfo(torch.float32).eps


def _config(directory: Path, layers: bool) -> Path:
    changes: dict[str, Any] = {
        **DEEP_SMALL,
        "experiment_id": "fsdp-layers-" + ("on" if layers else "off"),
        "baseline.training.sharding": "fsdp",
        "baseline.training.lm_head_dtype": "compute",
        "interventions": [
            {"path": "training.sharding", "values": ["none"]},
            {"path": "training.lm_head_dtype", "values": ["float32"]},
        ],
    }
    if layers:
        changes["diagnostics"] = {"layers": True}
    return experiment_config(directory, "cross_config_s0_hf_tiny_bf16.json", changes)


def _load(path: Path) -> dict[str, torch.Tensor]:
    loaded: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return loaded


def _run(directory: Path, layers: bool) -> dict[str, Any]:
    config = _config(directory, layers)
    artifacts = directory / "runs"
    code, out, err = cli("run", config, "--runtime", "hf", "--artifacts", artifacts)
    assert code in (0, 1), err[-3000:]
    run_dir = artifacts / json.loads(config.read_text())["experiment_id"]
    cases = {}
    for path in (run_dir / "cases").glob("*/*/comparison.json"):
        comparison = json.loads(path.read_text())
        cases[comparison["label"]] = {"comparison": comparison, "attempt": path.parent}
    return {"code": code, "text": out, "cases": cases, "run_dir": run_dir}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    directory = tmp_path_factory.mktemp("layers-fsdp")
    return {"on": _run(directory, True), "off": _run(directory, False)}


@pytest.fixture(scope="module")
def on(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return runs["on"]


def _training_evidence(case: dict[str, Any]) -> dict[str, Any]:
    evidence: dict[str, Any] = json.loads((case["attempt"] / "actual.json").read_text())[
        "training_evidence"
    ]
    return evidence


@pytest.mark.slow
def test_the_fsdp_trainer_captures_in_its_two_rank_processes(on: dict[str, Any]) -> None:
    assert set(on["cases"]) == LABELS
    for label in ("baseline", HEAD):
        case = on["cases"][label]
        ran = _training_evidence(case)
        assert ran["world_size"] == 2 and ran["backend"] == "gloo", label
        pids = [int(p) for p in str(ran["rank_pids"]).strip("[]").split(",")]
        assert len(set(pids)) == 2 and os.getpid() not in pids
        training = case["comparison"]["diagnostics"]["layers"]["training"]
        assert training["status"] == "layers_captured", (label, training)
        assert training["evidence"]["world_size"] == 2
        assert training["evidence"]["ranks_agree"] is True
        assert training["evidence"]["decoder_layers"] == 8
        sealed = _load(case["attempt"] / TRAINING)
        assert sealed["digests"].shape[0] == len(STATES) == 8 + 3
    unsharded = on["cases"][UNSHARDED]
    assert _training_evidence(unsharded)["world_size"] == 1
    evidence = unsharded["comparison"]["diagnostics"]["layers"]["training"]["evidence"]
    assert "ranks_agree" not in evidence and "world_size" not in evidence


@pytest.mark.slow
def test_the_probe_changes_no_verdict_mismatch_count_case_id_or_score(
    runs: dict[str, dict[str, Any]],
) -> None:
    on, off = runs["on"], runs["off"]
    assert on["code"] == off["code"]
    assert set(on["cases"]) == set(off["cases"]) == LABELS
    for label in LABELS:
        a, b = on["cases"][label], off["cases"][label]
        for key in ("case_id", "outcome", "mismatches", "active_tokens", "numerical"):
            assert a["comparison"][key] == b["comparison"][key], (label, key)
        assert "layers" not in b["comparison"]["diagnostics"]
        for name in ("score_rollout.pt", "score_training.pt", "token_diffs.pt"):
            assert (a["attempt"] / name).read_bytes() == (b["attempt"] / name).read_bytes()
        assert not (b["attempt"] / TRAINING).exists()


@pytest.mark.slow
def test_verify_accepts_the_fsdp_layers(on: dict[str, Any]) -> None:
    code, out, err = cli("verify", on["run_dir"], "--json")
    assert code == 0, out[-3000:] + err[-2000:]


# ---------------------------------------------------------------- an independent recompute


def _states(model: Any, batch: dict[str, torch.Tensor], float32_head: bool) -> list[torch.Tensor]:
    """The states the hooks of ``layer_hooks`` see (with ``float32_head``, the logits
    recomputed here in float32 from the final norm's output), at the scoring positions."""
    seen = hooked_states(model, batch)
    if float32_head:
        seen[-1] = seen[-2].float() @ model.lm_head.weight.detach().float().T
    return scoring_rows(seen, batch["active_mask"])


def _digests(sealed: dict[str, torch.Tensor], s: int) -> list[bytes]:
    return [bytes(d.tolist()) for d in sealed["digests"][s]]


@pytest.fixture(scope="module")
def plain_bf16() -> Any:
    from transformers import AutoModelForCausalLM

    path = resolve_checkpoint(DEEP, expected_digest=None).path
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.bfloat16, attn_implementation="sdpa", local_files_only=True
    )
    return model.eval()


def _bf16_norm_tolerance(s: int) -> float:
    """Relative tolerance of state ``s``'s norm between two bf16 forwards that are not bitwise
    equal: 16 units of bf16 rounding per state computed so far (embeddings = state 0)."""
    return 16 * float(torch.finfo(torch.bfloat16).eps) * (s + 1)


def _float32_logits_bound(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Per position, a rigorous bound on the relative error of the norm of float32 logits
    ``x @ W^T`` in any summation order: each logit is off by at most
    ``gamma_n * sum_j |x_j| |W_ij|`` (``gamma_n = n u / (1 - n u)``, ``u`` = float32 unit
    roundoff, ``n`` = the hidden width), so the norm is off by at most ``gamma_n`` times the
    norm of ``|W| |x|``, computed here in float64."""
    n, u = x.shape[-1], F32_EPS / 2
    gamma = n * u / (1 - n * u)
    wide, w = x.double(), weight.double()
    return (
        gamma
        * torch.linalg.vector_norm(wide.abs() @ w.abs().T, dim=-1)
        / torch.linalg.vector_norm(wide @ w.T, dim=-1)
    )


def _same_tokens(a: dict[str, Any], b: dict[str, Any]) -> None:
    mine, ref = (_load(c["attempt"] / "score_rollout.pt")["token_ids"] for c in (a, b))
    if not torch.equal(mine, ref):
        pytest.fail("the cases sampled other tokens: the captures would need a shared subset")


@pytest.mark.slow
@pytest.mark.parametrize("label", ["baseline", HEAD])
def test_sealed_fsdp_reductions_agree_with_plain_transformers_hooks(
    on: dict[str, Any], plain_bf16: Any, label: str
) -> None:
    """Per state: where the sealed FSDP baseline capture is bitwise the sealed unsharded one
    (and, for the float32 head, where the head case is bitwise the FSDP baseline), the sealed
    digests are those of the states the hooks here see and the norms are their exact norms;
    elsewhere the norms agree within bf16 rounding. The float32 head's logits (computed here
    in float32) agree within the float32 bound, which the bf16 logits' norms miss."""
    torch.set_num_threads(1)
    case, base, unsharded = (on["cases"][k] for k in (label, "baseline", UNSHARDED))
    _same_tokens(case, unsharded)
    batch = _load(case["attempt"] / "score_rollout.pt")
    sealed = _load(case["attempt"] / TRAINING)
    fsdp_base, reference = _load(base["attempt"] / TRAINING), _load(unsharded["attempt"] / TRAINING)
    mine = _states(plain_bf16, batch, float32_head=label == HEAD)
    assert torch.equal(sealed["positions"], batch["active_mask"][:, 1:].nonzero())
    bitwise = 0
    for s, state in enumerate(mine):
        if label == HEAD and STATES[s] == "logits":
            assert state.dtype == torch.float32
            bound = _float32_logits_bound(mine[s - 1], plain_bf16.lm_head.weight.detach())
            exact = torch.linalg.vector_norm(state.double(), dim=-1)
            assert bool(((sealed["norms"][s] - exact).abs() / exact <= bound).all())
            bf16 = fsdp_base["norms"][s]  # the compute-dtype head's logits: outside the bound
            assert bool(((bf16 - exact).abs() / exact > bound).any())
            continue
        derived = torch.equal(fsdp_base["digests"][s], reference["digests"][s]) and (
            torch.equal(sealed["digests"][s], fsdp_base["digests"][s])
        )
        exact = torch.linalg.vector_norm(state.double(), dim=-1)
        if derived:
            bitwise += 1
            assert _digests(sealed, s) == digests16(state), STATES[s]
            assert torch.allclose(sealed["norms"][s], exact, rtol=1e-12, atol=0)
        else:
            rel = (sealed["norms"][s] - exact).abs() / exact
            assert float(rel.max()) <= _bf16_norm_tolerance(s), (STATES[s], float(rel.max()))
    print(f"{label}: {bitwise} of {len(mine)} states bitwise equal to the unsharded trainer's")


@pytest.mark.slow
def test_a_float32_head_under_fsdp_moves_only_the_logits(on: dict[str, Any]) -> None:
    """The ranks' capture sees the float32-recomputed logits (``lm_head_at_score``'s hook runs
    first): every state before the head bitwise equal to the FSDP baseline's, the logits not,
    and the attribution says so."""
    head, base = on["cases"][HEAD], on["cases"]["baseline"]
    _same_tokens(head, base)
    a, b = _load(head["attempt"] / TRAINING), _load(base["attempt"] / TRAINING)
    assert [bool(v) for v in (a["digests"] == b["digests"]).all(-1).all(-1)] == [True] * 10 + [
        False
    ]
    (path,) = on["run_dir"].glob("attributions/*/attribution.json")
    attribution = json.loads(path.read_text())
    layers = {c["label"]: c for c in attribution["cases"]}[HEAD]["layers"]
    assert layers["training"]["first_moved_layer"] == "logits"
    assert layers["rollout"]["first_moved_layer"] is None


# ---------------------------------------------------------------- the wire and the group


def test_capture_requests_and_replies_cross_a_real_pipe() -> None:
    parent, child = multiprocessing.Pipe(duplex=True)
    batch = {"token_ids": torch.tensor([[2, 5, 1]]), "active_mask": torch.tensor([[0, 1, 1]])}
    reduction = {"norms": torch.tensor([[1.5, 2.0]], dtype=torch.float64)}
    data = tensor_bytes(reduction)
    digest = hashlib.sha256(data).hexdigest()
    try:
        wire.send(parent, wire.CaptureLayers.of(batch, batch_size=3, lm_head_dtype="float32"))
        request = wire.receive_request(child)
        assert isinstance(request, wire.CaptureLayers)
        assert (request.batch_size, request.lm_head_dtype) == (3, "float32")
        assert all(torch.equal(request.tensors()[k], batch[k]) for k in batch)
        captured = wire.LayersCaptured(rank=0, pid=7, reduction=data, reduction_sha256=digest)
        wire.send(child, captured)
        reply = wire.receive_reply(parent)
        assert isinstance(reply, wire.LayersCaptured) and reply.KIND == "layers"
        assert torch.equal(reply.tensors()["norms"], reduction["norms"])
        assert wire.layers_bytes(reduction) == data  # what a rank hashes is what it sends
    finally:
        parent.close()
        child.close()
    with pytest.raises(wire.ProtocolError, match="rank 1 sent no layer reduction"):
        wire.LayersCaptured(rank=1, pid=8, reduction=None, reduction_sha256=digest).tensors()
    flipped = bytearray(data)
    flipped[-1] ^= 1
    with pytest.raises(wire.ProtocolError, match="differs from its digest"):
        wire.LayersCaptured(
            rank=0, pid=7, reduction=bytes(flipped), reduction_sha256=digest
        ).tensors()


def test_ranks_whose_reductions_differ_are_an_error_naming_them() -> None:
    agree = [
        wire.LayersCaptured(rank=r, pid=10 + r, reduction=None, reduction_sha256="ab" * 32)
        for r in range(2)
    ]
    evidence = fsdp.layers_evidence(agree)
    assert evidence == {
        "world_size": 2,
        "rank_pids": [10, 11],
        "ranks_agree": True,
        "reduction_sha256": "ab" * 32,
    }
    other = wire.LayersCaptured(rank=1, pid=11, reduction=None, reduction_sha256="cd" * 32)
    with pytest.raises(fsdp.FsdpScorerError, match=r"differ \(rank 0 abab.*, rank 1 cdcd"):
        fsdp.layers_evidence([agree[0], other])


def test_a_rank_refuses_a_capture_before_init_with_its_traceback() -> None:
    request = wire.CaptureLayers(batch=b"", batch_size=1)
    reply = fsdp_rank.handle(None, request, 1, 9)
    assert isinstance(reply, wire.Failed) and (reply.rank, reply.pid) == (1, 9)
    assert "'CaptureLayers' before a successful 'init'" in reply.traceback
    reply = fsdp_rank.handle(None, wire.Close(), 0, 9)
    assert isinstance(reply, wire.Failed)
    assert "expected 'score', 'capture layers' or 'gather weights', got 'Close'" in reply.traceback


class _TamperingGroup(fsdp.FsdpScorerGroup):
    """A real local group whose parent, when ``tamper`` is set, rewrites rank 1's digest in the
    next layer capture's replies: a rank whose reduction disagrees."""

    tamper = False

    def _collect(self, kind: Any, timeout_s: float) -> Any:
        replies = super()._collect(kind, timeout_s)
        if self.tamper and kind is wire.LayersCaptured:
            replies[1] = dataclasses.replace(replies[1], reduction_sha256="0" * 64)
            self.tamper = False
        return replies


@contextmanager
def _group(transport: str) -> Iterator[fsdp.FsdpScorerGroup]:
    """Two rank processes on the deep model, local (subprocesses) or Ray (actors on a local
    cluster started, and shut down, here)."""
    path = resolve_checkpoint(DEEP, expected_digest=None).path
    kwargs: dict[str, Any] = {"dtype": "bfloat16", "attn_implementation": "sdpa", "world_size": 2}
    if transport == "local":
        group = _TamperingGroup(path, **kwargs)
        try:
            yield group
        finally:
            group.close()
        return
    pytest.importorskip("ray")
    from pytest_logprob_drift.execute.launch import Launch
    from pytest_logprob_drift.runtimes import ray_cluster
    from pytest_logprob_drift.runtimes.transformers import fsdp_ray

    lease = ray_cluster.acquire(Launch(launcher="ray", ray_num_cpus=2))
    try:
        ray_group = fsdp_ray.RayFsdpScorerGroup(path, rank_cpus=1.0, **kwargs)
        try:
            yield ray_group
        finally:
            ray_group.close()
    finally:
        lease.release()


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["local", "ray"])
def test_the_group_captures_what_was_sealed_and_refuses_when_closed(
    on: dict[str, Any], transport: str
) -> None:
    """A group of two ranks asked directly, over either transport: rank 0's reduction is the
    sealed baseline's, every rank's digest agrees; bad arguments and a closed group are
    refused."""
    case = on["cases"]["baseline"]
    batch = _load(case["attempt"] / "score_rollout.pt")
    sealed = _load(case["attempt"] / TRAINING)
    with _group(transport) as group:
        with pytest.raises(ValueError, match="batch_size must be >= 1"):
            group.capture_layers(batch, batch_size=0)
        with pytest.raises(ValueError, match="lm_head_dtype must be one of"):
            group.capture_layers(batch, batch_size=4, lm_head_dtype="float16")
        tensors, evidence = group.capture_layers(batch, batch_size=4)
        assert set(tensors) == set(sealed)
        assert all(torch.equal(tensors[k], sealed[k]) for k in sealed)
        assert evidence["world_size"] == 2 and evidence["ranks_agree"] is True
        assert evidence["rank_pids"] == group.pids and os.getpid() not in group.pids
        assert evidence["reduction_sha256"] == hashlib.sha256(tensor_bytes(tensors)).hexdigest()
        assert group.launch_evidence()["launcher"] == transport
        if isinstance(group, _TamperingGroup):
            group.tamper = True
            named = r"differ \(rank 0 [0-9a-f]{16}, rank 1 0{16}\)"
            with pytest.raises(fsdp.FsdpScorerError, match=named):
                group.capture_layers(batch, batch_size=4)
            assert not group.closed  # a disagreement is the capture's, not the group's failure
            again, _ = group.capture_layers(batch, batch_size=4)
            assert torch.equal(again["digests"], sealed["digests"])
    with pytest.raises(fsdp.FsdpScorerError, match="closed"):
        group.capture_layers(batch, batch_size=4)
