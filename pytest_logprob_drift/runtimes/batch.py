"""The canonical batch: the tensor wire format both scorers exchange.

Owns building the right-padded ``[B, L]`` tensors from prompts and sampled responses:
``token_ids`` (int64, padded with the pad id), ``attention_mask`` and ``active_mask`` (bool;
active = every generated token through the first EOS), ``logprobs`` (float32 at active positions,
0.0 elsewhere), ``prompt_lengths`` (int64 ``[B]``) and ``position_ids`` (0..len-1 on valid
tokens). Knows nothing about engines, models or comparison; imports only torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

CANONICAL_KEYS = ("token_ids", "attention_mask", "active_mask", "logprobs", "prompt_lengths",
                  "position_ids")


def canonical_batch(prompts: Sequence[Sequence[int]],
                    responses: Sequence[tuple[Sequence[int], Sequence[float]]],
                    pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded canonical tensors of ``prompts[i] + responses[i][0]``."""
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
        active[i, p:total] = True
        logprobs[i, p:total] = torch.tensor(list(lps), dtype=torch.float32)
        positions[i, :total] = torch.arange(total)
    return {"token_ids": token_ids, "attention_mask": attention, "active_mask": active,
            "logprobs": logprobs, "prompt_lengths": prompt_lengths, "position_ids": positions}
