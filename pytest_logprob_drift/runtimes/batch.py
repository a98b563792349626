"""The canonical batch: the tensor wire format both scorers exchange.

Owns the checks of a rollout request and building the right-padded ``[B, L]`` tensors from
prompts and sampled responses:
``token_ids`` (int64, padded with the pad id), ``attention_mask`` and ``active_mask`` (bool;
active = every generated token through the first EOS, or before it under
``response_before_eos``), ``logprobs`` (float32 at active positions,
0.0 elsewhere), ``prompt_lengths`` (int64 ``[B]``) and ``position_ids`` (0..len-1 on valid
tokens). Knows nothing about engines, models or comparison; imports only torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from pytest_logprob_drift.records import MaskPolicy

CANONICAL_KEYS = (
    "token_ids",
    "attention_mask",
    "active_mask",
    "logprobs",
    "prompt_lengths",
    "position_ids",
)


def validate_rollout_request(
    prompts: Sequence[Sequence[int]], *, batch_size: int, max_new_tokens: int, temperature: float
) -> None:
    """The checks every rollout engine applies before sampling (ValueError naming the value)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not temperature >= 0.0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not prompts:
        raise ValueError("no prompts")
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompt {i} is empty")


def canonical_batch(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[tuple[Sequence[int], Sequence[float]]],
    pad_token_id: int,
    *,
    eos_token_id: int | None,
    mask_policy: MaskPolicy,
) -> dict[str, torch.Tensor]:
    """Right-padded canonical tensors of ``prompts[i] + responses[i][0]``.

    Every sampled token is active, except under ``response_before_eos`` a response's final
    EOS token (``eos_token_id``), which stays in ``token_ids`` and the attention mask but is
    not scored."""
    drop_eos = mask_policy is MaskPolicy.RESPONSE_BEFORE_EOS
    if drop_eos and eos_token_id is None:
        raise ValueError("mask policy response_before_eos needs the runtime's EOS token id")
    n = len(prompts)
    length = max(len(p) + len(r[0]) for p, r in zip(prompts, responses, strict=True))
    token_ids = torch.full((n, length), pad_token_id, dtype=torch.long)
    attention = torch.zeros((n, length), dtype=torch.bool)
    active = torch.zeros((n, length), dtype=torch.bool)
    logprobs = torch.zeros((n, length), dtype=torch.float32)
    positions = torch.zeros((n, length), dtype=torch.long)
    prompt_lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    for i, (prompt, (tokens, lps)) in enumerate(zip(prompts, responses, strict=True)):
        p, total = len(prompt), len(prompt) + len(tokens)
        token_ids[i, :total] = torch.tensor([*prompt, *tokens], dtype=torch.long)
        attention[i, :total] = True
        scored = total - 1 if drop_eos and tokens and tokens[-1] == eos_token_id else total
        active[i, p:scored] = True
        logprobs[i, p:scored] = torch.tensor(list(lps)[: scored - p], dtype=torch.float32)
        positions[i, :total] = torch.arange(total)
    return {
        "token_ids": token_ids,
        "attention_mask": attention,
        "active_mask": active,
        "logprobs": logprobs,
        "prompt_lengths": prompt_lengths,
        "position_ids": positions,
    }


def active_rows(steps: Sequence[Sequence[torch.Tensor]], active: torch.Tensor) -> torch.Tensor:
    """The per-sample decode-step rows (``steps[i][t]``: the ``[V]`` distribution the ``t``-th
    generated token of sample ``i`` was drawn from) at the active positions of the canonical
    batch, stacked ``[A, V]`` in row-major order of ``active`` (a sample's active positions are
    its first generated tokens)."""
    rows: list[torch.Tensor] = []
    for i, sample in enumerate(steps):
        count = int(active[i].sum())
        if count > len(sample):
            raise ValueError(f"sample {i} has {count} active positions but {len(sample)} steps")
        rows.extend(sample[:count])
    if not rows:
        width = next((len(s[0]) for s in steps if s), 0)
        return torch.zeros((0, width), dtype=torch.float32)
    return torch.stack([r.detach().cpu() for r in rows])


def sequences(batch: Mapping[str, torch.Tensor]) -> list[list[int]]:
    """Each row's tokens (prompt + response, exactly as the canonical batch holds them)."""
    lengths = batch["attention_mask"].sum(-1).tolist()
    return [
        [int(t) for t in batch["token_ids"][i, : int(n)].tolist()] for i, n in enumerate(lengths)
    ]


def replay_grid(
    batch: Mapping[str, torch.Tensor],
    logprobs: Sequence[Sequence[float | None]],
    scored: Sequence[Sequence[int]],
    pad_token_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A replay's per-sequence logprobs and the token ids the engine reports it scored, on the
    canonical grid of ``batch``: float32 ``[B, L]`` logprobs (0.0 outside ``active_mask``) and
    int64 ``[B, L]`` token ids (``pad_token_id`` past each scored sequence). A sequence of
    another length than its row is a ValueError."""
    token_ids = batch["token_ids"]
    rows, width = token_ids.shape
    active = batch["active_mask"]
    values = torch.zeros((rows, width), dtype=torch.float32)
    ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
    if len(logprobs) != rows or len(scored) != rows:
        raise ValueError(f"replay returned {len(logprobs)} sequences for {rows} rows")
    for i in range(rows):
        seq = list(scored[i])
        if len(seq) != int(batch["attention_mask"][i].sum()):
            raise ValueError(
                f"replay scored {len(seq)} tokens of row {i}, which has "
                f"{int(batch['attention_mask'][i].sum())}"
            )
        ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        for k in active[i].nonzero().flatten().tolist():
            value = logprobs[i][k] if k < len(logprobs[i]) else None
            if value is None:
                raise ValueError(f"replay reports no logprob for row {i}, position {k}")
            values[i, k] = float(value)
    return values, ids
