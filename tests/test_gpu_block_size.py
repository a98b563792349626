"""Full-vocabulary row blocks sized from each device's memory target.

On CPU the block stays cache-sized (8 MiB of inputs and exponentials, as before); on a GPU the
work buffers a block allocates (two float32 ``[b, V]`` exponentials, four float32
``[b, width]`` tiles) stay within a sixteenth of one float32 ``[N, V]`` copy, the benchmarks'
memory target, instead of a fixed 256 MiB that exceeds it at V = 151,936. The bounds are
recomputed here from the buffer shapes.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pytest_logprob_drift.numerics.full_vocabulary import (  # noqa: E402
    DEFAULT_CHUNK_SIZE,
    block_rows,
    full_vocab_divergence,
    memory_target,
)

V = 151_936


@pytest.mark.parametrize("n", [1, 16, 512, 4096, 65536])
@pytest.mark.parametrize("vocab", [1024, 32000, V])
def test_gpu_blocks_fit_a_sixteenth_of_one_float32_copy(n: int, vocab: int) -> None:
    width = min(DEFAULT_CHUNK_SIZE, vocab)
    b = block_rows(rows=n, vocab=vocab, width=width, input_bytes=4, device_type="cuda")
    assert 1 <= b <= n
    buffers = 2 * b * vocab * 4 + 4 * b * width * 4  # e_x, e_y and four tiles, float32
    target = min(256 << 20, n * vocab * 4 // 16)
    assert memory_target(rows=n, vocab=vocab, device_type="cuda") == target
    if b > 1:
        assert buffers <= target
        # ...and one more row would not fit (or the block is already all rows)
        assert b == n or buffers + 8 * vocab + 16 * width > target


def test_at_the_benchmark_shape_the_gpu_block_is_below_the_target_not_256_mib() -> None:
    n, width = 4096, DEFAULT_CHUNK_SIZE
    b = block_rows(rows=n, vocab=V, width=width, input_bytes=4, device_type="cuda")
    buffers = 2 * b * V * 4 + 4 * b * width * 4
    naive_over_16 = n * V * 4 / 16
    assert buffers <= naive_over_16 < 256 << 20
    # the old fixed 256 MiB budget's buffers did not fit the target
    old = (256 << 20) // (V * (4 + 4 + 8))
    assert 2 * old * V * 4 + 4 * old * width * 4 > naive_over_16


def test_cpu_blocks_keep_the_cache_sized_budget() -> None:
    for vocab, input_bytes in ((1024, 4), (V, 4), (V, 8)):
        b = block_rows(
            rows=10**6, vocab=vocab, width=1024, input_bytes=input_bytes, device_type="cpu"
        )
        assert b == max(1, (8 << 20) // (vocab * (input_bytes + 8)))
    assert block_rows(rows=3, vocab=1024, width=1024, input_bytes=8, device_type="cpu") == 3


def test_the_blocked_reduction_matches_float64_whatever_the_block() -> None:
    gen = torch.Generator().manual_seed(7)
    x = torch.randn((37, 700), generator=gen) * 3
    y = x + 0.1 * torch.randn((37, 700), generator=gen)
    got = full_vocab_divergence(x, y, chunk_size=128)
    p, q = torch.softmax(x.double(), -1), torch.softmax(y.double(), -1)
    kl = (p * (torch.log_softmax(x.double(), -1) - torch.log_softmax(y.double(), -1))).sum(-1)
    tv = 0.5 * (p - q).abs().sum(-1)
    assert torch.allclose(got.kl_rollout_training, kl, rtol=1e-3, atol=1e-6)  # float32 tiles
    assert torch.allclose(got.total_variation, tv, rtol=1e-3, atol=1e-6)  # float32 tiles
