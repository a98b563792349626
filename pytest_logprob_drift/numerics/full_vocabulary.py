"""Full-vocabulary divergence between the rollout's and the trainer's next-token distributions.

Owns the per-position reductions over the whole vocabulary, streamed over vocabulary chunks so
that nothing of size [N, V] is ever allocated in float32 (inputs excepted): KL(rollout ||
training), KL(training || rollout), total variation, and the log of each side's probability mass
on the other side's support (what a truncation renormalization divides by); and the tokens that
carry most of the divergence at chosen positions.

Inputs are each side's logits or logprobs ``[N, V]`` in any floating dtype (they are normalized
here, so logits and logprobs mix freely); ``-inf`` marks a token outside a side's support (a
truncated distribution). Conventions, stated once: ``0 * log 0 = 0``; ``KL(p || q) = inf``
where some token has ``p > 0`` (a finite input) and ``q = 0`` (``-inf``), whatever the size of
``p`` (support, not float underflow, decides); a row with no finite entry, or with a NaN or
``+inf`` entry, is not a distribution and gives NaN everywhere.

Knows nothing about engines, files, verdicts, thresholds or the sealed form
(``numerics.divergence_file``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "CUDA_MEMORY_FRACTION",
    "DEFAULT_CHUNK_SIZE",
    "DIVERGENCE_FIELDS",
    "Contributors",
    "Divergence",
    "block_rows",
    "full_vocab_divergence",
    "memory_target",
    "top_contributors",
    "worst_rows",
]

DEFAULT_CHUNK_SIZE = 32768
"""Vocabulary width of one streamed work tile."""
_INPUT_BLOCK_BYTES = 8 << 20
"""Bytes of one row block's inputs and float32 exponentials (both sides) on CPU: pass 2
re-reads them from cache, not DRAM."""
_CUDA_BLOCK_BYTES = 256 << 20
"""The most one row block's work buffers take on a GPU (kernel launches and host syncs, not
caches, set the block size there: the larger the block, the fewer launches)."""
CUDA_MEMORY_FRACTION = 16
"""On a GPU the work buffers stay within a sixteenth of one float32 ``[N, V]`` copy: the
memory target of the benchmarks (naive log-softmax's extra memory / 16)."""
_FLT_MAX = torch.finfo(torch.float32).max

DIVERGENCE_FIELDS = (
    "kl_rollout_training",
    "kl_training_rollout",
    "total_variation",
    "log_mass_training_on_rollout_support",
    "log_mass_rollout_on_training_support",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Divergence:
    """Per-position reductions, float64 ``[N]`` each (p = rollout, q = training)."""

    kl_rollout_training: Tensor
    """KL(p || q) = sum p (log p - log q)."""
    kl_training_rollout: Tensor
    """KL(q || p)."""
    total_variation: Tensor
    """0.5 * sum |p - q|, in [0, 1]."""
    log_mass_training_on_rollout_support: Tensor
    """log sum_{v: p(v) > 0} q(v): 0 when the rollout keeps every token the trainer has."""
    log_mass_rollout_on_training_support: Tensor
    """log sum_{v: q(v) > 0} p(v)."""

    def tensors(self) -> dict[str, Tensor]:
        return {name: getattr(self, name) for name in DIVERGENCE_FIELDS}


def _check_pair(rollout: Tensor, training: Tensor) -> None:
    for name, t in (("rollout", rollout), ("training", training)):
        if not isinstance(t, Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor [N, V]")
        if t.dim() != 2:
            raise ValueError(f"{name} must be [N, V], got shape {tuple(t.shape)}")
    if rollout.shape != training.shape:
        raise ValueError(
            f"shapes differ: rollout {tuple(rollout.shape)}, training {tuple(training.shape)}"
        )
    if rollout.device != training.device:
        raise ValueError(f"devices differ: {rollout.device} and {training.device}")


def _exp_rows(x: Tensor, e: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """Pass 1 over a row block ``x`` [b, V], one vocabulary chunk at a time: ``e = exp(x - m)``
    (float32, kept for pass 2), and the float64 ``(logsumexp, m)`` of each row: NaN for a row
    with a NaN or +inf entry, -inf for a row without a finite entry."""
    rows, vocab = x.shape
    m = x.amax(dim=-1).float()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # all -inf: sums to 0, not NaN
    total = torch.zeros(rows, dtype=torch.float64, device=x.device)
    shift = m.unsqueeze(1)
    for c0 in range(0, vocab, width):
        chunk = x[:, c0 : c0 + width]
        work = e[:, c0 : c0 + chunk.shape[1]]
        torch.sub(chunk, shift, out=work)  # upcast fused into the subtraction
        work.exp_()
        total += work.sum(dim=-1).double()
    return m.double() + torch.log(total), m.double()


def memory_target(*, rows: int, vocab: int, device_type: str) -> int:
    """Bytes one call's row-block buffers may take on ``device_type``: on CPU the cache-sized
    block (inputs included, ``_INPUT_BLOCK_BYTES``); elsewhere a sixteenth of one float32
    ``[rows, V]`` copy (``CUDA_MEMORY_FRACTION``), at most ``_CUDA_BLOCK_BYTES``."""
    if device_type == "cpu":
        return _INPUT_BLOCK_BYTES
    return min(_CUDA_BLOCK_BYTES, rows * vocab * 4 // CUDA_MEMORY_FRACTION)


def block_rows(*, rows: int, vocab: int, width: int, input_bytes: int, device_type: str) -> int:
    """Rows of one block of ``full_vocab_divergence``: as many as the device's memory target
    (``memory_target``) holds, between 1 and ``rows``. Per row a block holds, on CPU, both
    sides' inputs (``input_bytes``: the two element sizes) and float32 exponentials over the
    vocabulary (the cache-resident working set); elsewhere its allocations: the two float32
    ``[b, V]`` exponentials and four float32 ``[b, width]`` tiles."""
    target = memory_target(rows=rows, vocab=vocab, device_type=device_type)
    if device_type == "cpu":
        per_row = vocab * (input_bytes + 8)
    else:
        per_row = 8 * vocab + 16 * width
    return max(1, min(rows, target // max(1, per_row)))


def full_vocab_divergence(
    rollout: Tensor, training: Tensor, *, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> Divergence:
    """The per-position reductions of two ``[N, V]`` distributions given as logits/logprobs.

    Row blocks small enough to stay in cache (``b`` rows: both sides' inputs plus their
    float32 exponentials take about 8 MiB), two streamed passes over vocabulary chunks of each
    block: (1) per side, ``exp(x - max)`` and the float64 logsumexp; (2) ``p``, ``q`` and
    ``log p - log q = (x - y) - (lse_x - lse_y)`` in float32 tiles of ``b x chunk_size``,
    reduced per row and accumulated in float64. Extra memory: two ``b x V`` and four
    ``b x chunk_size`` float32 buffers, whatever N; nothing of size [N, V] is allocated.
    """
    _check_pair(rollout, training)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    n, vocab = rollout.shape
    device = rollout.device
    out = {name: torch.zeros(n, dtype=torch.float64, device=device) for name in DIVERGENCE_FIELDS}
    if n == 0:
        return Divergence(**out)
    if vocab == 0:
        for t in out.values():
            t.fill_(math.nan)
        return Divergence(**out)
    width = min(chunk_size, vocab)
    block = block_rows(
        rows=n,
        vocab=vocab,
        width=width,
        input_bytes=rollout.element_size() + training.element_size(),
        device_type=device.type,
    )
    with torch.no_grad():
        buffers = _Buffers(
            e_x=torch.empty((block, vocab), dtype=torch.float32, device=device),
            e_y=torch.empty((block, vocab), dtype=torch.float32, device=device),
            tiles=tuple(
                torch.empty((block, width), dtype=torch.float32, device=device) for _ in range(4)
            ),
        )
        for r0 in range(0, n, block):
            r1 = min(r0 + block, n)
            part = _block(rollout[r0:r1], training[r0:r1], width, buffers)
            for name in DIVERGENCE_FIELDS:
                out[name][r0:r1] = part[name]
    return Divergence(**out)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Buffers:
    """The float32 work memory of one call (reused by every row block)."""

    e_x: Tensor
    e_y: Tensor
    tiles: tuple[Tensor, ...]


@dataclass(frozen=True, slots=True)
class _Sums:
    """float64 per-row accumulators of one row block (updated in place)."""

    kl_pq: Tensor
    kl_qp: Tensor
    tv: Tensor
    out_p: Tensor
    """p's mass on tokens q gives 0."""
    out_q: Tensor
    p_escapes: Tensor
    """bool: p has a token outside q's support (KL(p || q) = inf)."""
    q_escapes: Tensor

    @classmethod
    def zeros(cls, rows: int, device: torch.device) -> _Sums:
        def z() -> Tensor:
            return torch.zeros(rows, dtype=torch.float64, device=device)

        def f() -> Tensor:
            return torch.zeros(rows, dtype=torch.bool, device=device)

        return cls(z(), z(), z(), z(), z(), f(), f())


def _block(x: Tensor, y: Tensor, width: int, buffers: _Buffers) -> dict[str, Tensor]:
    """The reductions of one row block (p from ``x``, q from ``y``)."""
    rows, vocab = x.shape
    e_x, e_y = buffers.e_x[:rows], buffers.e_y[:rows]
    lse_x, m_x = _exp_rows(x, e_x, width)
    lse_y, m_y = _exp_rows(y, e_y, width)
    # p = exp(x - lse) = exp(x - m) * exp(m - lse): pass 1's exponentials, rescaled.
    scale_x = torch.exp(m_x - lse_x).float().unsqueeze(1)
    scale_y = torch.exp(m_y - lse_y).float().unsqueeze(1)
    shift = (lse_x - lse_y).float().unsqueeze(1)
    both_f32 = x.dtype == torch.float32 and y.dtype == torch.float32
    # Only a block with a -inf entry (a truncated support) needs the support bookkeeping.
    truncated = bool(torch.isneginf(x.amin(dim=-1)).any() | torch.isneginf(y.amin(dim=-1)).any())
    acc = _Sums.zeros(rows, x.device)
    for c0 in range(0, vocab, width):
        xc, yc = x[:, c0 : c0 + width], y[:, c0 : c0 + width]
        w = xc.shape[1]
        d, p, q, scratch = (t[:rows, :w] for t in buffers.tiles)
        # log p - log q = (x - y) - (lse_x - lse_y): the input difference is exact where the
        # two sides are close (where the precision matters), unlike (x - lse_x) - (y - lse_y).
        if both_f32:
            torch.sub(xc, yc, out=d)
        else:  # upcast first: a bf16 - bf16 difference would round in bf16
            d.copy_(xc)
            d.sub_(yc)
        d.sub_(shift)
        torch.mul(e_x[:, c0 : c0 + w], scale_x, out=p)
        torch.mul(e_y[:, c0 : c0 + w], scale_y, out=q)
        if truncated:
            # -inf - finite = -inf (q keeps a token p drops), finite - -inf = +inf (p keeps a
            # token q drops), -inf - -inf = NaN (neither has it): to float32's min / max, 0.
            d.nan_to_num_(nan=0.0)
            p_out, q_out = d.amax(dim=-1) == _FLT_MAX, d.amin(dim=-1) == -_FLT_MAX
            acc.p_escapes.logical_or_(p_out)
            acc.q_escapes.logical_or_(q_out)
            if bool(p_out.any()) or bool(q_out.any()):  # only where the supports differ
                acc.out_q.add_(torch.where(d == -_FLT_MAX, q, 0.0).sum(dim=-1, dtype=torch.float64))
                acc.out_p.add_(torch.where(d == _FLT_MAX, p, 0.0).sum(dim=-1, dtype=torch.float64))
        # (An elementwise product then a row sum: far faster on CPU than a batched dot.)
        acc.kl_pq.add_(torch.mul(p, d, out=scratch).sum(dim=-1))
        acc.kl_qp.sub_(torch.mul(q, d, out=scratch).sum(dim=-1))
        acc.tv.add_(torch.sub(p, q, out=d).abs_().sum(dim=-1))
    inf = torch.full_like(acc.kl_pq, math.inf)
    result = {
        "kl_rollout_training": torch.where(acc.p_escapes, inf, acc.kl_pq.clamp_(min=0.0)),
        "kl_training_rollout": torch.where(acc.q_escapes, inf, acc.kl_qp.clamp_(min=0.0)),
        "total_variation": (0.5 * acc.tv).clamp_(max=1.0),
        "log_mass_training_on_rollout_support": _log_in_mass(
            e_y, scale_y, x, acc.out_q, acc.q_escapes
        ),
        "log_mass_rollout_on_training_support": _log_in_mass(
            e_x, scale_x, y, acc.out_p, acc.p_escapes
        ),
    }
    invalid = ~(torch.isfinite(lse_x) & torch.isfinite(lse_y))
    if bool(invalid.any()):
        for value in result.values():
            value.masked_fill_(invalid, math.nan)
    return result


def _log_in_mass(
    e_a: Tensor, scale_a: Tensor, support_of: Tensor, out_mass: Tensor, escapes: Tensor
) -> Tensor:
    """log of a's mass on the support of ``support_of`` per row: ``log1p(-out)`` (0 where
    nothing escapes), summed directly over the support for the rare rows that keep less than
    half their mass, where ``1 - out`` would lose the precision of a small S."""
    log_s = torch.where(escapes, torch.log1p(-out_mass.clamp(max=1.0)), 0.0)
    for row in (escapes & (out_mass > 0.5)).nonzero().flatten().tolist():
        kept = ~torch.isneginf(support_of[row])
        inside = torch.where(kept, e_a[row], 0.0).sum(dtype=torch.float64) * scale_a[row, 0]
        log_s[row] = torch.log(inside)
    return log_s


# ------------------------------------------------------------------------- contributors


@dataclass(frozen=True, slots=True, kw_only=True)
class Contributors:
    """The ``k`` tokens with the largest ``|p - q|`` at each of ``W`` chosen rows."""

    rows: Tensor
    """int64 [W]: the row (position index) of each entry."""
    token_ids: Tensor
    """int64 [W, k]."""
    rollout_logprobs: Tensor
    """float64 [W, k] (``-inf`` outside the rollout's support)."""
    training_logprobs: Tensor
    """float64 [W, k]."""
    tv_share: Tensor
    """float64 [W, k]: 0.5 |p - q| of the token, its share of the row's total variation."""

    def tensors(self) -> dict[str, Tensor]:
        return {
            "rows": self.rows,
            "token_ids": self.token_ids,
            "rollout_logprobs": self.rollout_logprobs,
            "training_logprobs": self.training_logprobs,
            "tv_share": self.tv_share,
        }


def top_contributors(rollout: Tensor, training: Tensor, rows: Tensor, *, k: int) -> Contributors:
    """For each of ``rows`` (a few positions), the ``k`` tokens carrying the most total
    variation, in float64 (one [V] row at a time: W x V float64 at most)."""
    _check_pair(rollout, training)
    vocab = rollout.shape[1]
    k = max(0, min(k, vocab))
    w = int(rows.numel())
    token_ids = torch.zeros((w, k), dtype=torch.long)
    lps, lqs, shares = (torch.zeros((w, k), dtype=torch.float64) for _ in range(3))
    with torch.no_grad():
        for i, row in enumerate(rows.tolist()):
            lp = torch.log_softmax(rollout[row].double(), dim=-1)
            lq = torch.log_softmax(training[row].double(), dim=-1)
            share = 0.5 * (lp.exp() - lq.exp()).abs()
            top = torch.topk(share, k, sorted=True)
            token_ids[i] = top.indices.cpu()
            shares[i] = top.values.cpu()
            lps[i] = lp[top.indices].cpu()
            lqs[i] = lq[top.indices].cpu()
    return Contributors(
        rows=rows.to(torch.long).cpu(),
        token_ids=token_ids,
        rollout_logprobs=lps,
        training_logprobs=lqs,
        tv_share=shares,
    )


def worst_rows(total_variation: Tensor, count: int) -> Tensor:
    """Row indices of the ``count`` largest total variations (NaN last), largest first."""
    tv = torch.nan_to_num(total_variation, nan=-1.0)
    count = max(0, min(count, int(tv.numel())))
    return torch.argsort(tv, descending=True, stable=True)[:count]
