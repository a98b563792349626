"""Operator-owned correctness tests for the ``selected_logprob`` production backends.

Every backend is compared against a float64 reference computed from the *same* already
rounded inputs (``torch.log_softmax(logits.double(), -1).gather``), so bf16/fp16 inputs are
judged on the kernel's float32 arithmetic, not on input rounding.

Tolerance (``_tolerance``): 4e-6 absolute for moderate logits. The float32 result cannot be
better than a few ulps of the magnitudes it is computed from: ``selected - max`` is rounded at
the ulp of ``|selected| + |max|`` (fp32 ulp <= 2**-23 relative) and the final subtraction at the
ulp of the result, which is no larger. So the bound grows as ``2**-21 * (|selected| + |max|)``
(about four ulps) once that exceeds 4e-6, i.e. for |logits| beyond ~8; with +/-1e4 logits this
is ~1e-2, the size of a few fp32 ulps at 2e4. Moderate inputs are also checked against the
flat 4e-6 bound on their own.

The vocabulary-parallel backend runs on two real gloo ranks (spawned once per module and fed
cases through queues; the group is destroyed and the processes joined at teardown): those tests
are ``slow``, as FSDP ranks are (torch.distributed processes, outside the fast loop).
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import itertools
import json
import math
import queue
import socket
import subprocess
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

if importlib.util.find_spec("logprob_drift_operators") is None:  # spawned gloo ranks, uninstalled
    _bootstrap = importlib.util.spec_from_file_location(
        "_operators_conftest_bootstrap", Path(__file__).with_name("conftest.py")
    )
    assert _bootstrap is not None and _bootstrap.loader is not None
    _bootstrap.loader.exec_module(importlib.util.module_from_spec(_bootstrap))

from logprob_drift_operators.selected_logprob import (
    chunked_selected_logprob,
    descriptors,
    reference_selected_logprob,
    vocab_parallel_selected_logprob,
)
from logprob_drift_operators.selected_logprob.chunked import streaming_max_sumexp
from logprob_drift_operators.selected_logprob.vocab_parallel import (
    VocabLayout,
    process_group_selected_logprob,
    shard_vocab,
)

MODERATE_BOUND = 4e-6
RELATIVE_BOUND = 2.0**-21
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
NEG_INF = float("-inf")
WORLD_SIZE = 2
PROPERTY_SETTINGS = settings(suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- references


def float64_reference(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """log_softmax in float64 of the already-rounded inputs, gathered at the tokens."""
    return torch.log_softmax(logits.double(), dim=-1).gather(-1, token_ids.unsqueeze(-1))[..., 0]


def _tolerance(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    wide = logits.double()
    finite = torch.where(torch.isfinite(wide), wide, torch.full_like(wide, NEG_INF))
    row_max = finite.amax(dim=-1) if wide.shape[-1] else torch.zeros(wide.shape[:-1])
    selected = wide.gather(-1, token_ids.unsqueeze(-1))[..., 0]
    scale = selected.abs() + row_max.abs()
    return torch.clamp(RELATIVE_BOUND * scale, min=MODERATE_BOUND)


def assert_matches_reference(
    result: torch.Tensor, logits: torch.Tensor, token_ids: torch.Tensor
) -> None:
    assert result.dtype == torch.float32
    assert result.shape == token_ids.shape
    expected = float64_reference(logits, token_ids)
    assert torch.isfinite(result).all(), result
    diff = (result.double() - expected).abs()
    tol = _tolerance(logits, token_ids)
    worst = int(torch.argmax(diff - tol).item()) if diff.numel() else 0
    assert bool((diff <= tol).all()), (
        f"max |diff| {diff.max().item():.3e} exceeds tolerance at flat index {worst}: "
        f"diff {diff.reshape(-1)[worst].item():.3e} > tol {tol.reshape(-1)[worst].item():.3e}"
    )


# --------------------------------------------------------------------------- input strategy


@dataclass(frozen=True)
class Case:
    logits: torch.Tensor
    token_ids: torch.Tensor
    regime: str

    def __repr__(self) -> str:
        return (
            f"Case(regime={self.regime!r}, shape={tuple(self.logits.shape)}, "
            f"dtype={self.logits.dtype}, token_ids={self.token_ids.tolist()})"
        )


REGIMES = ("moderate", "huge", "very_negative", "sparse_extreme", "masked", "masked_span", "ties")


def build_case(
    *, lead: tuple[int, ...], vocab: int, dtype: torch.dtype, regime: str, scale: float, seed: int
) -> Case:
    gen = torch.Generator().manual_seed(seed)
    shape = (*lead, vocab)
    base = torch.randn(shape, generator=gen, dtype=torch.float64) * scale
    token_ids = torch.randint(0, vocab, lead, generator=gen, dtype=torch.int64)
    big = 6.0e4 if dtype == torch.float16 else 1.0e30  # "very negative" still finite in dtype
    if regime == "huge":
        base = torch.randn(shape, generator=gen, dtype=torch.float64) * 1.0e4
    elif regime == "very_negative":
        offset = -1.0e4 if dtype == torch.float16 else -1.0e6
        base = base + offset
    elif regime == "sparse_extreme":
        pick = torch.rand(shape, generator=gen) < 0.3
        base = torch.where(pick, torch.full_like(base, -big), base)
        spike = torch.rand(shape, generator=gen) < 0.05
        base = torch.where(spike, base + 50.0, base)
    elif regime == "masked":
        fraction = float(torch.rand((), generator=gen)) * 1.2  # > 1 masks every entry
        mask = torch.rand(shape, generator=gen) < fraction
        base = base.masked_fill(mask, NEG_INF)
    elif regime == "masked_span":  # whole chunks (for small chunk sizes) are -inf
        start = int(torch.randint(0, vocab, (), generator=gen))
        stop = int(torch.randint(start, vocab + 1, (), generator=gen))
        base[..., start:stop] = NEG_INF
    elif regime == "ties":
        base = torch.full(shape, scale, dtype=torch.float64)
    if dtype == torch.float16:
        base = base.clamp(min=-6.0e4, max=6.0e4)  # keep finite entries finite in fp16
    logits = base.to(dtype)
    # The contract: the selected token's logit is finite (masked entries are the others).
    selected = logits.gather(-1, token_ids.unsqueeze(-1))
    fixed = torch.where(torch.isfinite(selected), selected, torch.zeros_like(selected))
    logits.scatter_(-1, token_ids.unsqueeze(-1), fixed)
    return Case(logits=logits, token_ids=token_ids, regime=regime)


@st.composite
def cases(draw: st.DrawFn, regimes: tuple[str, ...] = REGIMES, max_vocab: int = 300) -> Case:
    lead = tuple(draw(st.lists(st.integers(0, 4), min_size=1, max_size=3)))
    return build_case(
        lead=lead,
        vocab=draw(st.integers(1, max_vocab)),
        dtype=draw(st.sampled_from(DTYPES)),
        regime=draw(st.sampled_from(regimes)),
        scale=draw(st.sampled_from([0.0, 0.1, 1.0, 3.0, 8.0, 30.0])),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


CHUNK_SIZES = st.sampled_from([1, 2, 3, 7, 64, 4096])


# --------------------------------------------------------------------------- property tests


@PROPERTY_SETTINGS
@given(case=cases())
def test_reference_matches_float64(case: Case) -> None:
    result = reference_selected_logprob(case.logits, case.token_ids)
    assert_matches_reference(result, case.logits, case.token_ids)


@PROPERTY_SETTINGS
@given(case=cases(), chunk_size=CHUNK_SIZES)
def test_chunked_matches_float64(case: Case, chunk_size: int) -> None:
    result = chunked_selected_logprob(case.logits, case.token_ids, chunk_size=chunk_size)
    assert_matches_reference(result, case.logits, case.token_ids)


@PROPERTY_SETTINGS
@given(case=cases(regimes=("moderate", "masked", "masked_span", "ties")), chunk_size=CHUNK_SIZES)
def test_moderate_logits_meet_flat_bound(case: Case, chunk_size: int) -> None:
    if case.logits.numel():
        finite = case.logits[torch.isfinite(case.logits)]
        if finite.numel() and finite.abs().max().item() > 8.0:
            return  # outside "moderate"; covered by the scaled bound above
    expected = float64_reference(case.logits, case.token_ids)
    for result in (
        reference_selected_logprob(case.logits, case.token_ids),
        chunked_selected_logprob(case.logits, case.token_ids, chunk_size=chunk_size),
    ):
        diff = (result.double() - expected).abs()
        assert diff.numel() == 0 or diff.max().item() <= MODERATE_BOUND


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("chunk_size", [3, 7, 64, 1000, 4096])
def test_realistic_row_moderate_bound(dtype: torch.dtype, chunk_size: int) -> None:
    # V not divisible by any chunk size; more rows than one CPU row block.
    case = build_case(lead=(3, 50), vocab=5003, dtype=dtype, regime="moderate", scale=2.0, seed=7)
    expected = float64_reference(case.logits, case.token_ids)
    result = chunked_selected_logprob(case.logits, case.token_ids, chunk_size=chunk_size)
    assert (result.double() - expected).abs().max().item() <= MODERATE_BOUND
    reference = reference_selected_logprob(case.logits, case.token_ids)
    assert (reference.double() - expected).abs().max().item() <= MODERATE_BOUND


def test_chunked_at_a_real_vocabulary_size() -> None:
    # Qwen-sized V with the default chunk size (151,936 = 37 full chunks + 384): the streamed
    # sum stays within the flat bound, where torch's fused CPU log_softmax does not.
    tokens, vocab = 48, 151_936
    for dtype in (torch.float32, torch.bfloat16):
        case = build_case(
            lead=(tokens,), vocab=vocab, dtype=dtype, regime="moderate", scale=3.0, seed=11
        )
        result = chunked_selected_logprob(case.logits, case.token_ids)
        expected = float64_reference(case.logits, case.token_ids)
        assert (result.double() - expected).abs().max().item() <= MODERATE_BOUND


# --------------------------------------------------------------------------- edge behaviour


@pytest.mark.parametrize(
    "backend", [reference_selected_logprob, chunked_selected_logprob], ids=["reference", "chunked"]
)
def test_zero_tokens(backend: Any) -> None:
    for lead in [(0,), (2, 0), (0, 3, 1)]:
        result = backend(torch.randn(*lead, 11), torch.zeros(lead, dtype=torch.int64))
        assert result.shape == lead and result.dtype == torch.float32


def test_chunk_that_is_entirely_masked_gives_no_nan() -> None:
    logits = torch.randn(4, 20)
    logits[:, :7] = NEG_INF  # chunks 0 and 1 (chunk_size=3) fully masked, chunk 2 partly
    logits[1, :19] = NEG_INF  # only the last entry is finite
    token_ids = torch.tensor([10, 19, 7, 15])
    result = chunked_selected_logprob(logits, token_ids, chunk_size=3)
    assert torch.isfinite(result).all()
    assert result[1].item() == 0.0
    assert_matches_reference(result, logits, token_ids)


def test_only_selected_finite_gives_exact_zero() -> None:
    logits = torch.full((2, 9), NEG_INF, dtype=torch.bfloat16)
    token_ids = torch.tensor([0, 8])
    logits[0, 0] = 3.0
    logits[1, 8] = -1.0e4
    for chunk_size in (1, 4, 9, 4096):
        result = chunked_selected_logprob(logits, token_ids, chunk_size=chunk_size)
        assert result.tolist() == [0.0, 0.0]


def test_uniform_logits_give_minus_log_vocab() -> None:
    vocab = 151_936
    logits = torch.full((2, vocab), 7.0, dtype=torch.bfloat16)
    result = chunked_selected_logprob(logits, torch.tensor([0, vocab - 1]))
    assert torch.allclose(
        result.double(),
        torch.full((2,), -math.log(vocab), dtype=torch.float64),
        rtol=0,
        atol=MODERATE_BOUND,
    )


def test_masked_selected_token_follows_reference_semantics() -> None:
    # Outside the contract (selected logit must be finite): both backends agree on -inf / NaN.
    logits = torch.randn(2, 6)
    logits[0, 2] = NEG_INF
    logits[1, :] = NEG_INF
    token_ids = torch.tensor([2, 0])
    for backend_result in (
        reference_selected_logprob(logits, token_ids),
        chunked_selected_logprob(logits, token_ids, chunk_size=4),
    ):
        assert backend_result[0].item() == NEG_INF
        assert math.isnan(backend_result[1].item())


def test_non_contiguous_logits() -> None:
    logits = torch.randn(40, 3, 17).transpose(0, 1)  # [3, 40, 17], not contiguous
    token_ids = torch.randint(0, 17, (3, 40))
    result = chunked_selected_logprob(logits, token_ids, chunk_size=5)
    assert_matches_reference(result, logits, token_ids)


def test_result_is_forward_only_and_leaves_inputs_untouched() -> None:
    logits = torch.randn(5, 33, requires_grad=True)
    before = logits.detach().clone()
    token_ids = torch.randint(0, 33, (5,))
    result = chunked_selected_logprob(logits, token_ids, chunk_size=8)
    assert not result.requires_grad
    assert torch.equal(logits.detach(), before)
    assert_matches_reference(result, logits.detach(), token_ids)


def test_streaming_core_reports_empty_rows_without_nan() -> None:
    logits = torch.tensor([[NEG_INF, NEG_INF, NEG_INF], [0.0, NEG_INF, 0.0]])
    row_max, row_sum = streaming_max_sumexp(logits, chunk_size=2)
    assert row_max[0].item() == torch.finfo(torch.float32).min and row_sum[0].item() == 0.0
    assert row_max[1].item() == 0.0 and row_sum[1].item() == 2.0
    empty_max, empty_sum = streaming_max_sumexp(torch.empty(3, 0), chunk_size=2)
    assert (empty_sum == 0).all() and (empty_max == torch.finfo(torch.float32).min).all()


class _LargestFloat32Allocation(TorchDispatchMode):
    """Records the largest float32 storage (in elements) that any dispatched op allocates.

    Outputs that share storage with an input (views, ``out=`` and in-place results) are not
    allocations and are skipped.
    """

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        inputs = tree_flatten((args, kwargs or {}))[0]
        existing = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.float32:
                continue
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in existing:
                self.largest = max(self.largest, storage.nbytes() // 4)
        return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_chunked_never_materializes_full_vocab_float32(dtype: torch.dtype) -> None:
    tokens, vocab = 1024, 12_000
    logits = torch.randn(tokens, vocab).to(dtype)
    token_ids = torch.randint(0, vocab, (tokens,))
    with _LargestFloat32Allocation() as chunked_probe:
        chunked_selected_logprob(logits, token_ids)
    with _LargestFloat32Allocation() as reference_probe:
        reference_selected_logprob(logits, token_ids)
    assert reference_probe.largest >= tokens * vocab  # the probe does see full tensors
    # One work tile (<= 2**19 elements on CPU) at most; at most 1/16 of [tokens, V].
    assert chunked_probe.largest <= 1 << 19
    assert chunked_probe.largest * 16 <= tokens * vocab


# --------------------------------------------------------------------------- error paths


@pytest.mark.parametrize(
    "backend", [reference_selected_logprob, chunked_selected_logprob], ids=["reference", "chunked"]
)
def test_input_contract_errors(backend: Any) -> None:
    logits = torch.randn(2, 3, 10)
    with pytest.raises(ValueError, match=r"token_ids shape must equal logits.shape\[:-1\]"):
        backend(logits, torch.zeros(2, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"token_ids shape must equal"):
        backend(logits, torch.zeros(2, 3, 1, dtype=torch.int64))
    out_of_range = torch.full((2, 3), 10, dtype=torch.int64)
    out_of_range[0, 0] = 0
    with pytest.raises(ValueError, match=r"must lie in \[0, 10\); got values in \[0, 10\]"):
        backend(logits, out_of_range)
    with pytest.raises(ValueError, match=r"got values in \[-1, "):
        backend(logits, torch.full((2, 3), -1, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"token_ids must be torch\.int64"):
        backend(logits, torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(TypeError, match="logits must be a floating-point tensor"):
        backend(torch.zeros(2, 3, 10, dtype=torch.int64), torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="0-d tensor"):
        backend(torch.tensor(1.0), torch.tensor(0))
    with pytest.raises(ValueError, match=r"empty vocabulary dimension \(V == 0\)"):
        backend(torch.randn(2, 0), torch.zeros(2, dtype=torch.int64))


def test_chunk_size_errors() -> None:
    logits, token_ids = torch.randn(2, 5), torch.zeros(2, dtype=torch.int64)
    for bad in (0, -1, -4096):
        with pytest.raises(ValueError, match="chunk_size must be a positive number"):
            chunked_selected_logprob(logits, token_ids, chunk_size=bad)
    for wrong_type in (2.0, True, "64"):
        with pytest.raises(TypeError, match="chunk_size must be an int"):
            chunked_selected_logprob(logits, token_ids, chunk_size=wrong_type)  # type: ignore[arg-type]


def test_vocab_parallel_requires_initialized_group() -> None:
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match=r"initialized torch\.distributed process group"):
        vocab_parallel_selected_logprob(
            torch.randn(2, 4), torch.zeros(2, dtype=torch.int64), vocab_start=0
        )


# --------------------------------------------------------------------------- layout


@given(vocab=st.integers(1, 300_000), world=st.integers(1, 64))
def test_shard_vocab_tiles_vocabulary_evenly(vocab: int, world: int) -> None:
    shards = [shard_vocab(vocab, world, rank) for rank in range(world)]
    assert shards[0][0] == 0 and shards[-1][1] == vocab
    assert all(prev[1] == cur[0] for prev, cur in itertools.pairwise(shards))
    sizes = [end - start for start, end in shards]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    layout = VocabLayout.build(vocab, world)
    assert layout.shards == tuple(shards) and layout.shard(world - 1) == shards[-1]
    record = json.loads(json.dumps(layout.to_json()))
    assert record["vocab_size"] == vocab and record["world_size"] == world
    assert [tuple(s) for s in record["shards"]] == shards


def test_shard_vocab_uneven_example_and_errors() -> None:
    assert [shard_vocab(151_937, 2, r) for r in range(2)] == [(0, 75_969), (75_969, 151_937)]
    assert [shard_vocab(1, 2, r) for r in range(2)] == [(0, 1), (1, 1)]
    with pytest.raises(ValueError, match="rank must lie in"):
        shard_vocab(10, 2, 2)
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        shard_vocab(10, 0, 0)
    with pytest.raises(ValueError, match="vocab_size must be >= 1"):
        shard_vocab(0, 2, 0)
    with pytest.raises(TypeError, match="rank must be an int"):
        shard_vocab(10, 2, 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shards must tile"):
        VocabLayout(vocab_size=10, world_size=2, shards=((0, 4), (5, 10)))
    with pytest.raises(ValueError, match="cover"):
        VocabLayout(vocab_size=10, world_size=2, shards=((0, 4), (4, 9)))
    with pytest.raises(ValueError, match="2 shards for world_size 3"):
        VocabLayout(vocab_size=10, world_size=3, shards=((0, 4), (4, 10)))


# --------------------------------------------------------------------------- descriptors


DESCRIPTOR_KEYS = {
    "operation",
    "backend_id",
    "target_tags",
    "devices",
    "dtypes",
    "required_topology",
    "alignment_properties",
    "lifecycle",
    "factory",
    "version",
    "build_fingerprint",
    "fallback_policy",
    "test_only",
}


def test_descriptors_describe_real_backends() -> None:
    records = descriptors()
    by_id = {record["backend_id"]: record for record in records}
    assert set(by_id) == {
        "rlkernel.reference_logp",
        "rlkernel.chunked_logp",
        "rlkernel.vocab_parallel_logp",
    }
    expected_callables = {
        "rlkernel.reference_logp": reference_selected_logprob,
        "rlkernel.chunked_logp": chunked_selected_logprob,
        "rlkernel.vocab_parallel_logp": process_group_selected_logprob,
    }
    for backend_id, record in by_id.items():
        assert set(record) == DESCRIPTOR_KEYS
        assert record["operation"] == "selected_logprob"
        assert record["lifecycle"] == "engine_construction"
        assert record["fallback_policy"] == "never" and record["test_only"] is False
        assert record["devices"] == ["cpu", "cuda"]
        assert record["dtypes"] == ["float32", "bfloat16", "float16"]
        assert "fp32_accumulation" in record["alignment_properties"]
        assert ("exact_to_float_rounding" in record["alignment_properties"]) == (
            backend_id != "rlkernel.reference_logp"
        )
        module_name, _, attr = record["factory"].partition(":")
        assert module_name.startswith("logprob_drift_operators.selected_logprob.")
        assert getattr(importlib.import_module(module_name), attr) is expected_callables[backend_id]
        fingerprint = record["build_fingerprint"]
        assert len(fingerprint) == 16 and int(fingerprint, 16) >= 0
        assert json.loads(json.dumps(record)) == record  # plain JSON data
    assert by_id["rlkernel.vocab_parallel_logp"]["target_tags"] == ["training"]
    assert by_id["rlkernel.vocab_parallel_logp"]["required_topology"] == {
        "training": {"min_world_size": 2}
    }
    assert (
        "vocab_parallel_collectives"
        in by_id["rlkernel.vocab_parallel_logp"]["alignment_properties"]
    )
    assert "no_full_vocab_materialization" in by_id["rlkernel.chunked_logp"]["alignment_properties"]
    assert by_id["rlkernel.chunked_logp"]["target_tags"] == ["rollout", "training"]
    assert len({record["build_fingerprint"] for record in records}) == 3
    assert descriptors() == records  # deterministic


def test_descriptors_load_without_torch() -> None:
    code = (
        "import sys\n"
        "from logprob_drift_operators.selected_logprob import descriptors\n"
        "assert len(descriptors()) == 3\n"
        "assert 'torch' not in sys.modules, 'descriptors() imported torch'\n"
    )
    env_path = [str(Path(__file__).resolve().parents[2])]
    prelude = (
        f"import sys; sys.path[:0] = {env_path!r}\n"
        "import importlib.util\n"
        "if importlib.util.find_spec('logprob_drift_operators') is None:\n"
        f"    import runpy; runpy.run_path({str(Path(__file__).with_name('conftest.py'))!r})\n"
    )
    subprocess.run([sys.executable, "-c", prelude + code], check=True, timeout=60)


def test_descriptors_convert_to_framework_records() -> None:
    registry = pytest.importorskip("pytest_logprob_drift.registry.catalog")
    for record in descriptors():
        converted = registry.OperatorDescriptor.from_mapping(record)
        assert converted.backend_id == record["backend_id"]
        assert converted.build_fingerprint == record["build_fingerprint"]


# --------------------------------------------------------------------------- two gloo ranks


def _serialize(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _deserialize(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=True)


def _rank_main(rank: int, port: int, inbox: Any, outbox: Any) -> None:
    """One gloo rank: serve jobs from ``inbox`` until ``None``; always destroy the group."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD_SIZE,
        timeout=timedelta(seconds=60),
    )
    try:
        while (job := inbox.get()) is not None:
            logits, token_ids, chunk_size, starts = _deserialize(job)
            vocab = logits.shape[-1]
            if starts is None:
                start, end = shard_vocab(vocab, WORLD_SIZE, rank)
            else:
                start, end = starts[rank]
            local = logits[..., start:end].contiguous()
            try:
                result = vocab_parallel_selected_logprob(
                    local, token_ids, vocab_start=start, chunk_size=chunk_size
                )
                outbox.put((rank, "ok", _serialize(result)))
            except Exception as exc:  # report, keep serving; a peer stuck in a collective
                # fails too once the gloo timeout expires
                detail = "".join(traceback.format_exception(exc))
                outbox.put((rank, type(exc).__name__, f"{exc}\n{detail}"))
    finally:
        dist.destroy_process_group()


class GlooPair:
    """Two spawned gloo ranks that evaluate the vocabulary-parallel backend on demand."""

    def __init__(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        ctx = mp.get_context("spawn")
        self._outbox = ctx.Queue()
        self._inboxes = [ctx.Queue() for _ in range(WORLD_SIZE)]
        self._procs = [
            ctx.Process(
                target=_rank_main,
                args=(rank, port, self._inboxes[rank], self._outbox),
                daemon=True,  # ended at exit even if no test closes the pair (-x stopped first)
            )
            for rank in range(WORLD_SIZE)
        ]
        for proc in self._procs:
            proc.start()

    def run(
        self,
        logits: torch.Tensor,
        token_ids: torch.Tensor,
        *,
        chunk_size: int = 4096,
        starts: list[tuple[int, int]] | None = None,
    ) -> list[tuple[str, Any]]:
        job = _serialize((logits, token_ids, chunk_size, starts))
        for inbox in self._inboxes:
            inbox.put(job)
        replies: dict[int, tuple[str, Any]] = {}
        while len(replies) < WORLD_SIZE:
            try:
                rank, status, payload = self._outbox.get(timeout=120)
            except queue.Empty:
                raise AssertionError("gloo ranks did not answer within 120 s") from None
            replies[rank] = (status, _deserialize(payload) if status == "ok" else payload)
        return [replies[rank] for rank in range(WORLD_SIZE)]

    def close(self) -> None:
        for inbox in self._inboxes:
            inbox.put(None)
        for proc in self._procs:
            proc.join(timeout=60)
        alive = [proc for proc in self._procs if proc.is_alive()]
        for proc in alive:
            proc.terminate()
            proc.join(timeout=10)
        codes = [proc.exitcode for proc in self._procs]
        assert not alive and codes == [0] * WORLD_SIZE, f"gloo ranks exit codes {codes}"


@pytest.fixture(scope="module")
def gloo_pair() -> Iterator[GlooPair]:
    pair = GlooPair()
    try:
        yield pair
    finally:
        pair.close()


def _assert_ranks_agree_with_reference(
    replies: list[tuple[str, Any]], logits: torch.Tensor, token_ids: torch.Tensor
) -> None:
    for status, payload in replies:
        assert status == "ok", payload
        assert_matches_reference(payload, logits, token_ids)
    assert torch.equal(replies[0][1], replies[1][1])  # every rank returns the same result


@pytest.mark.slow
@PROPERTY_SETTINGS
@given(case=cases(max_vocab=200), chunk_size=st.sampled_from([1, 3, 7, 64, 4096]))
def test_vocab_parallel_matches_float64(gloo_pair: GlooPair, case: Case, chunk_size: int) -> None:
    replies = gloo_pair.run(case.logits, case.token_ids, chunk_size=chunk_size)
    _assert_ranks_agree_with_reference(replies, case.logits, case.token_ids)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_vocab_parallel_uneven_split(gloo_pair: GlooPair, dtype: torch.dtype) -> None:
    # V = 5003 splits 2502 / 2501; tokens on both sides of the boundary; rank 1's whole shard
    # is masked in row 0 and rank 0's in row 1.
    case = build_case(lead=(4, 6), vocab=5003, dtype=dtype, regime="moderate", scale=3.0, seed=3)
    logits, token_ids = case.logits.clone(), case.token_ids.clone()
    token_ids[0] %= 2502  # row 0 selects only rank 0's ids, row 1 only rank 1's
    token_ids[1] = 2502 + token_ids[1] % 2501
    token_ids[0, :3] = torch.tensor([0, 2501, 17])
    token_ids[1, :3] = torch.tensor([2502, 5002, 4000])
    logits[0, :, 2502:] = NEG_INF
    logits[1, :, :2502] = NEG_INF
    replies = gloo_pair.run(logits, token_ids, chunk_size=64)
    _assert_ranks_agree_with_reference(replies, logits, token_ids)
    single = chunked_selected_logprob(logits, token_ids, chunk_size=64)
    assert (replies[0][1] - single).abs().max().item() <= MODERATE_BOUND


@pytest.mark.slow
def test_vocab_parallel_rank_with_empty_shard(gloo_pair: GlooPair) -> None:
    logits = torch.randn(3, 1)  # V = 1 < world size: rank 1 owns (1, 1)
    token_ids = torch.zeros(3, dtype=torch.int64)
    replies = gloo_pair.run(logits, token_ids)
    _assert_ranks_agree_with_reference(replies, logits, token_ids)
    assert replies[0][1].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.slow
def test_vocab_parallel_zero_tokens(gloo_pair: GlooPair) -> None:
    replies = gloo_pair.run(torch.randn(0, 3, 9), torch.zeros(0, 3, dtype=torch.int64))
    for status, payload in replies:
        assert status == "ok" and payload.shape == (0, 3) and payload.dtype == torch.float32


@pytest.mark.slow
def test_vocab_parallel_rejects_unowned_and_doubly_owned_tokens(gloo_pair: GlooPair) -> None:
    logits = torch.randn(2, 9)
    replies = gloo_pair.run(logits, torch.tensor([3, 9]))  # 9 is outside [0, 9)
    for status, message in replies:
        assert (
            status == "ValueError"
            and "token id 9 at flat position 1 is owned by 0 ranks" in message
        )
    overlapping = [(0, 9), (4, 9)]  # both ranks claim ids 4..8
    replies = gloo_pair.run(logits, torch.tensor([2, 5]), starts=overlapping)
    for status, message in replies:
        assert status == "ValueError" and "is owned by 2 ranks" in message
    replies = gloo_pair.run(logits, torch.zeros(3, dtype=torch.int64))  # shape mismatch
    for status, message in replies:
        assert status == "ValueError" and "token_ids shape must equal" in message
    # The group still works after rejected inputs.
    good = gloo_pair.run(logits, torch.tensor([0, 8]))
    _assert_ranks_agree_with_reference(good, logits, torch.tensor([0, 8]))


def test_process_group_entry_needs_an_initialized_group() -> None:
    logits = torch.zeros(2, 5)
    with pytest.raises(RuntimeError, match=r"initialized torch\.distributed process group"):
        process_group_selected_logprob(logits, torch.zeros(2, dtype=torch.int64))
