"""Full-vocabulary divergence between the rollout's and the trainer's next-token distributions.

Owns the per-position reductions over the whole vocabulary, streamed over vocabulary chunks so
that nothing of size [N, V] is ever allocated in float32 (inputs excepted): KL(rollout ||
training), KL(training || rollout), total variation, and the log of each side's probability mass
on the other side's support (what a truncation renormalization divides by); the tokens that
carry most of the divergence at chosen positions; the JSON summary of the sealed reductions;
and the semantic-offset diagnostic (differences explained by a per-position ``log S``, or at
any temperature by the processed distribution recomputed from the other side's full logits).

Inputs are each side's logits or logprobs ``[N, V]`` in any floating dtype (they are normalized
here, so logits and logprobs mix freely); ``-inf`` marks a token outside a side's support (a
truncated distribution). Conventions, stated once: ``0 * log 0 = 0``; ``KL(p || q) = inf``
where some token has ``p > 0`` (a finite input) and ``q = 0`` (``-inf``), whatever the size of
``p`` (support, not float underflow, decides); a row with no finite entry, or with a NaN or
``+inf`` entry, is not a distribution and gives NaN everywhere.

Knows nothing about engines, files, verdicts or thresholds; imports only torch, records and
``sampling`` (the one definition of processed logits).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from pytest_logprob_drift.records import JSONScalar
from pytest_logprob_drift.sampling import Truncation, processed_logits

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DIVERGENCE_FIELDS",
    "EXPLANATIONS",
    "SEMANTICS_KEYS",
    "Contributors",
    "Divergence",
    "SemanticOffset",
    "full_vocab_divergence",
    "processed_residual",
    "processing_tensor",
    "sealed_diagnostics",
    "sealed_tensors",
    "semantic_offset",
    "summarize",
    "top_contributors",
    "worst_rows",
]

DEFAULT_CHUNK_SIZE = 32768
"""Vocabulary width of one streamed work tile."""
_INPUT_BLOCK_BYTES = 8 << 20
"""Bytes of one row block's inputs and float32 exponentials (both sides) on CPU: pass 2
re-reads them from cache, not DRAM."""
_CUDA_BLOCK_BYTES = 256 << 20
"""The same on CUDA, where kernel launches and host syncs, not caches, set the block size."""
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


def _block_rows(vocab: int, bytes_per_column: int, device: torch.device) -> int:
    budget = _CUDA_BLOCK_BYTES if device.type == "cuda" else _INPUT_BLOCK_BYTES
    return max(1, budget // max(1, vocab * bytes_per_column))


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
    column = rollout.element_size() + training.element_size() + 8
    block = min(n, _block_rows(vocab, column, device))
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


# ------------------------------------------------------------------------- summaries


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _stats(values: Tensor) -> dict[str, JSONScalar]:
    """mean / p99 / max over the finite values; how many are infinite or NaN."""
    finite = values[torch.isfinite(values)]
    stats: dict[str, JSONScalar] = {
        "mean": None,
        "p99": None,
        "max": None,
        "infinite": int(torch.isinf(values).sum()),
        "nan": int(torch.isnan(values).sum()),
    }
    if finite.numel():
        stats["mean"] = float(finite.mean())
        stats["p99"] = float(torch.quantile(finite, 0.99))
        stats["max"] = float(finite.max())
    return stats


def summarize(
    divergence: Mapping[str, Tensor],
    active: Tensor,
    contributors: Mapping[str, Tensor] | None,
) -> dict[str, Any]:
    """The JSON summary of sealed reductions (``[B, L]`` float64 each, valid where ``active``):
    statistics per reduction, the worst positions by total variation with their top tokens.
    A pure function of the tensors, so ``verify`` recomputes it exactly."""
    positions = active.nonzero()
    summary: dict[str, Any] = {
        "positions": int(positions.shape[0]),
        **{name: _stats(divergence[name][active]) for name in DIVERGENCE_FIELDS[:3]},
        "truncated_positions": int(
            (
                (divergence["log_mass_training_on_rollout_support"][active] != 0)
                | (divergence["log_mass_rollout_on_training_support"][active] != 0)
            ).sum()
        ),
    }
    worst: list[dict[str, Any]] = []
    if contributors is not None:
        for i, row in enumerate(contributors["rows"].tolist()):
            sample, position = (int(v) for v in positions[row].tolist())
            worst.append(
                {
                    "sample": sample,
                    "position": position,
                    **{
                        name: _finite_or_none(float(divergence[name][sample, position]))
                        for name in DIVERGENCE_FIELDS[:3]
                    },
                    "top_tokens": [
                        {
                            "token_id": int(contributors["token_ids"][i, j]),
                            "rollout_logprob": _finite_or_none(
                                float(contributors["rollout_logprobs"][i, j])
                            ),
                            "training_logprob": _finite_or_none(
                                float(contributors["training_logprobs"][i, j])
                            ),
                            "tv_share": float(contributors["tv_share"][i, j]),
                        }
                        for j in range(contributors["token_ids"].shape[1])
                    ],
                }
            )
    summary["worst_positions"] = worst
    return summary


def worst_rows(total_variation: Tensor, count: int) -> Tensor:
    """Row indices of the ``count`` largest total variations (NaN last), largest first."""
    tv = torch.nan_to_num(total_variation, nan=-1.0)
    count = max(0, min(count, int(tv.numel())))
    return torch.argsort(tv, descending=True, stable=True)[:count]


# ------------------------------------------------------------------------- semantic offset

OFFSET_TOLERANCE = 1e-5
"""|diff - predicted offset| below which a position counts as explained."""
OFFSET_MIN_FRACTION = 0.9
"""Share of active positions that must be explained for the diagnostic to fire."""


_PROCESSED_BLOCK_BYTES = 64 << 20
"""Bytes of one row block of the processed recompute (float32 ``b x V``; top_p sorts it)."""


def processed_residual(
    reported: Tensor, full: Tensor, token_ids: Tensor, how: Truncation
) -> Tensor:
    """float64 ``[A]``: ``|reported - log_softmax(processed_logits(full))[token]|`` per row.

    The hypothesis "this side reported the processed logprob (``how``: the declared
    temperature and truncation, ``sampling.processed_logits``) of the other side's
    distribution": ``full`` is the other side's ``[A, V]`` logits (or logprobs: a constant
    shift per row changes nothing, temperature and truncation included), ``reported`` this
    side's sampled-token logprobs ``[A]`` and ``token_ids`` the sampled tokens ``[A]``. Row
    blocks of about 64 MiB of float32, whatever A. NaN where a row is not a distribution."""
    rows, vocab = full.shape
    out = torch.full((rows,), math.nan, dtype=torch.float64)
    block = max(1, _PROCESSED_BLOCK_BYTES // max(1, 4 * vocab))
    for r0 in range(0, rows, block):
        r1 = min(rows, r0 + block)
        logp = torch.log_softmax(processed_logits(full[r0:r1], how), dim=-1)
        picked = logp.gather(-1, token_ids[r0:r1].long().unsqueeze(-1).to(logp.device))
        out[r0:r1] = (reported[r0:r1].double().cpu() - picked.squeeze(-1).double().cpu()).abs()
    return out


EXPLANATIONS = ("truncation_renormalization", "processed_rollout", "processed_training")
"""What the semantic-offset diagnostic can say explains a case's differences: a per-position
``log S`` (truncation renormalization at temperature 1), the rollout's processed logprobs of
the trainer's logits, or the trainer's processed logprobs of the rollout's logits."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SemanticOffset:
    """Whether the sampling semantics explain ``training - rollout``, and which explanation."""

    fires: bool
    explanation: str | None
    """One of ``EXPLANATIONS`` when it fires, else None."""
    explained_fraction: float
    truncated_positions: int
    tolerance: float
    message: str

    def to_json(self) -> dict[str, JSONScalar]:
        return {
            "fires": self.fires,
            "explanation": self.explanation,
            "explained_fraction": self.explained_fraction,
            "truncated_positions": self.truncated_positions,
            "tolerance": self.tolerance,
            "message": self.message,
        }


def _processing_text(processing: Tensor) -> str:
    """``temperature 0.7, top_p 0.9`` from the sealed ``[temperature, top_p, top_k, min_p]``."""
    t, p, k, m = (float(v) for v in processing.tolist())
    parts = [f"temperature {t:g}"]
    if not math.isnan(p):
        parts.append(f"top_p {p:g}")
    if not math.isnan(k):
        parts.append(f"top_k {int(k)}")
    if not math.isnan(m):
        parts.append(f"min_p {m:g}")
    return ", ".join(parts)


def processing_tensor(how: Truncation | None) -> Tensor:
    """float64 ``[4]``: ``[temperature, top_p, top_k, min_p]`` (NaN: not given / no truncation
    declared), sealed so that the diagnostic's text is recomputed offline."""
    if how is None:
        return torch.full((4,), math.nan, dtype=torch.float64)
    values = [how.temperature, how.top_p, how.top_k, how.min_p]
    return torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float64)


def _processing_changes_logits(processing: Tensor) -> bool:
    """Whether the declared processing changes a distribution at all (not greedy, and a
    temperature other than 1 or some truncation)."""
    t, p, k, m = (float(v) for v in processing.tolist())
    if math.isnan(t) or t < 1e-5:
        return False
    return t != 1.0 or (not math.isnan(p) and p < 1.0) or not math.isnan(k) or m > 0.0


def semantic_offset(
    training: Tensor,
    rollout: Tensor,
    active: Tensor,
    log_mass_training_on_rollout_support: Tensor,
    log_mass_rollout_on_training_support: Tensor,
    *,
    processed_rollout_residual: Tensor | None = None,
    processed_training_residual: Tensor | None = None,
    processing: Tensor | None = None,
    tolerance: float = OFFSET_TOLERANCE,
    min_fraction: float = OFFSET_MIN_FRACTION,
) -> SemanticOffset:
    """Do the sampling semantics explain the selected-token differences, and how?

    1. Truncation renormalization (temperature 1): when the rollout renormalizes over a
       truncated support (processed logprobs) and the trainer does not, ``log p_r = log p_t -
       log S`` on the support, with ``S`` the trainer's mass on the rollout's support:
       ``training - rollout = log S``; the other way round ``-log S'``. The prediction is
       ``log_mass_training_on_rollout_support - log_mass_rollout_on_training_support`` per
       position (0 where the supports agree). It fires when some active position is truncated
       by more than ``tolerance`` and at least ``min_fraction`` of the active positions match.
    2. Processed semantics at any temperature: at temperature ``T`` the difference is no
       per-position constant (``log p_r = z/T - logsumexp_S(z/T)`` against ``z -
       logsumexp(z)``), so the processed distribution is recomputed from the other side's full
       logits at the declared temperature and truncation (``processed_residual``, sealed as
       ``processed_rollout_residual`` / ``processed_training_residual``). A side's hypothesis
       fires when the declared processing changes a distribution at all, at least
       ``min_fraction`` of the active positions match within ``tolerance``, and plain
       agreement (``|diff| <= tolerance``) does not already cover ``min_fraction`` of them.
    The first explanation that fires, in that order, is the one reported.
    """
    diff = training.double()[active] - rollout.double()[active]
    predicted = (
        log_mass_training_on_rollout_support[active] - log_mass_rollout_on_training_support[active]
    )
    n = int(diff.numel())
    truncated = int((predicted.abs() > tolerance).sum())
    matched = (diff - predicted).abs() <= tolerance
    fraction = float(matched.double().mean()) if n else 0.0
    if truncated > 0 and fraction >= min_fraction:
        return SemanticOffset(
            fires=True,
            explanation=EXPLANATIONS[0],
            explained_fraction=fraction,
            truncated_positions=truncated,
            tolerance=tolerance,
            message=(
                f"truncation renormalization: |diff| matches log S within {tolerance:g} at "
                f"{100 * fraction:.0f}% of positions ({truncated} of {n} truncated): the sides "
                "apply different sampling semantics, not different arithmetic"
            ),
        )
    agree = float((diff.abs() <= tolerance).double().mean()) if n else 0.0
    hypotheses = (
        (EXPLANATIONS[1], processed_rollout_residual, "rollout", "trainer"),
        (EXPLANATIONS[2], processed_training_residual, "trainer", "rollout"),
    )
    if processing is not None and n and agree < min_fraction:
        if _processing_changes_logits(processing):
            for name, residual, side, other in hypotheses:
                if residual is None:
                    continue
                explained = float((residual[active] <= tolerance).double().mean())
                if explained >= min_fraction:
                    return SemanticOffset(
                        fires=True,
                        explanation=name,
                        explained_fraction=explained,
                        truncated_positions=truncated,
                        tolerance=tolerance,
                        message=(
                            f"processed semantics: the {side}'s logprobs match the processed "
                            f"distribution ({_processing_text(processing)}) recomputed from "
                            f"the {other}'s full logits within {tolerance:g} at "
                            f"{100 * explained:.0f}% of positions: the {side} reports "
                            f"processed logprobs and the {other} raw ones, not different "
                            "arithmetic"
                        ),
                    )
    if truncated:
        message = (
            f"supports differ at {truncated} of {n} positions, but log S explains only "
            f"{100 * fraction:.0f}% of the differences"
        )
    else:
        message = "no truncation offset: both sides put mass on the same tokens"
    return SemanticOffset(
        fires=False,
        explanation=None,
        explained_fraction=fraction,
        truncated_positions=truncated,
        tolerance=tolerance,
        message=message,
    )


# ------------------------------------------------------------------------- sealed form

SEALED_TOP_KEYS = (
    "top_rows",
    "top_token_ids",
    "top_rollout_logprobs",
    "top_training_logprobs",
    "top_tv_share",
)
"""``divergence.pt`` holds ``DIVERGENCE_FIELDS`` (float64 ``[B, L]``, 0 where inactive) and
these (the contributors at the worst positions)."""
SEMANTICS_KEYS = ("processed_rollout_residual", "processed_training_residual", "processing")
"""The semantic-offset diagnostic's evidence: ``processed_residual`` of each side against the
other's full logits (float64 ``[B, L]``, 0 where inactive, NaN everywhere when no sampling was
declared) and the declared ``processing_tensor``."""
SEALED_KEYS = frozenset((*DIVERGENCE_FIELDS, *SEALED_TOP_KEYS, *SEMANTICS_KEYS))


def sealed_tensors(
    rollout_full: Tensor,
    training_full: Tensor,
    active: Tensor,
    *,
    top_k: int,
    worst_positions: int,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    truncation: Truncation | None = None,
    token_ids: Tensor | None = None,
    rollout_logprobs: Tensor | None = None,
    training_logprobs: Tensor | None = None,
) -> dict[str, Tensor]:
    """What ``divergence.pt`` seals for one case: the per-position reductions scattered onto
    the ``[B, L]`` grid of ``active``, the top tokens at the worst positions (by total
    variation) and the processed-semantics residuals (``SEMANTICS_KEYS``; computed when
    ``truncation``, the declared sampling, and the ``[B, L]`` ``token_ids`` and both sides'
    sampled-token logprobs are given). ``rollout_full`` / ``training_full`` are ``[A, V]``,
    one row per active position in row-major order."""
    count = int(active.sum())
    if rollout_full.shape[0] != count or training_full.shape[0] != count:
        raise ValueError(
            f"full distributions have {rollout_full.shape[0]} (rollout) and "
            f"{training_full.shape[0]} (training) rows for {count} active positions"
        )
    reductions = full_vocab_divergence(rollout_full, training_full, chunk_size=chunk_size)
    sealed: dict[str, Tensor] = {}
    for name, values in reductions.tensors().items():
        grid = torch.zeros(active.shape, dtype=torch.float64)
        grid[active.cpu()] = values.cpu()
        sealed[name] = grid
    rows = worst_rows(reductions.total_variation.cpu(), worst_positions)
    top = top_contributors(rollout_full, training_full, rows.to(rollout_full.device), k=top_k)
    sealed.update(
        {
            "top_rows": top.rows,
            "top_token_ids": top.token_ids,
            "top_rollout_logprobs": top.rollout_logprobs,
            "top_training_logprobs": top.training_logprobs,
            "top_tv_share": top.tv_share,
        }
    )
    sealed.update(
        _semantics(
            rollout_full,
            training_full,
            active,
            truncation,
            token_ids,
            rollout_logprobs,
            training_logprobs,
        )
    )
    return sealed


def _semantics(
    rollout_full: Tensor,
    training_full: Tensor,
    active: Tensor,
    truncation: Truncation | None,
    token_ids: Tensor | None,
    rollout_logprobs: Tensor | None,
    training_logprobs: Tensor | None,
) -> dict[str, Tensor]:
    mask = active.cpu()
    out = {
        "processed_rollout_residual": torch.full(mask.shape, math.nan, dtype=torch.float64),
        "processed_training_residual": torch.full(mask.shape, math.nan, dtype=torch.float64),
        "processing": processing_tensor(truncation),
    }
    if (
        truncation is None
        or token_ids is None
        or rollout_logprobs is None
        or training_logprobs is None
    ):
        out["processing"] = processing_tensor(None)
        return out
    tokens = token_ids.cpu()[mask]
    for name, reported, other in (
        ("processed_rollout_residual", rollout_logprobs, training_full),
        ("processed_training_residual", training_logprobs, rollout_full),
    ):
        grid = torch.zeros(mask.shape, dtype=torch.float64)
        grid[mask] = processed_residual(reported.cpu()[mask], other, tokens, truncation)
        out[name] = grid
    return out


def sealed_diagnostics(
    sealed: Mapping[str, Tensor], training: Tensor, rollout: Tensor, active: Tensor
) -> dict[str, Any]:
    """comparison.json's ``full_vocabulary`` and ``semantic_offset`` diagnostics, from the
    sealed tensors and the sampled-token logprobs alone (what ``verify`` recomputes)."""
    missing = SEALED_KEYS - set(sealed)
    if missing:
        raise ValueError(f"sealed divergence lacks {sorted(missing)}")
    for name in DIVERGENCE_FIELDS:
        if sealed[name].shape != active.shape or sealed[name].dtype != torch.float64:
            raise ValueError(f"{name} is not float64 {tuple(active.shape)}")
    rows = sealed["top_rows"]
    if rows.dim() != 1 or rows.dtype != torch.long:
        raise ValueError("top_rows must be int64 [W]")
    if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= int(active.sum())):
        raise ValueError("top_rows names a position that is not active")
    contributors = {
        "rows": rows,
        "token_ids": sealed["top_token_ids"],
        "rollout_logprobs": sealed["top_rollout_logprobs"],
        "training_logprobs": sealed["top_training_logprobs"],
        "tv_share": sealed["top_tv_share"],
    }
    width = (rows.numel(),)
    for name, tensor in contributors.items():
        if name != "rows" and (tensor.dim() != 2 or tensor.shape[:1] != width):
            raise ValueError(f"top_{name} must be [{rows.numel()}, k]")
    for name in SEMANTICS_KEYS[:2]:
        if sealed[name].shape != active.shape or sealed[name].dtype != torch.float64:
            raise ValueError(f"{name} is not float64 {tuple(active.shape)}")
    if sealed["processing"].shape != (4,) or sealed["processing"].dtype != torch.float64:
        raise ValueError("processing is not float64 [4]")
    offset = semantic_offset(
        training,
        rollout,
        active,
        sealed["log_mass_training_on_rollout_support"],
        sealed["log_mass_rollout_on_training_support"],
        processed_rollout_residual=sealed["processed_rollout_residual"],
        processed_training_residual=sealed["processed_training_residual"],
        processing=sealed["processing"],
    )
    return {
        "full_vocabulary": summarize(sealed, active, contributors),
        "semantic_offset": offset.to_json(),
    }
