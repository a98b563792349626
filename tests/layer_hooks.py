"""Test-side hidden states of a plain transformers model, for the layer diagnostics' tests.

What the tests check the sealed layer reductions against, written without the project's
code: a plain ``AutoModelForCausalLM`` with forward hooks written here on the embeddings,
every decoder layer, the final norm and the LM head (the full states of one forward of a
canonical batch), the rows that score the active tokens (``t - 1`` for every active ``t``,
row-major), and the 16-byte SHA-256 digest of a state's dtype name and bytes.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint

DEEP = "tiny://qwen3-deep-l8-h64-v1"


def plain_model(dtype: torch.dtype, uri: str = DEEP, attn: str = "sdpa") -> Any:
    """The checkpoint ``uri`` as plain transformers loads it, in eval mode."""
    from transformers import AutoModelForCausalLM

    path = resolve_checkpoint(uri, expected_digest=None).path
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn)
    return model.eval()


def hooked_states(model: Any, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """``[B, length, width]`` per state (embeddings, each decoder layer's output, final norm,
    LM head) of one teacher-forced forward of ``batch`` trimmed to its longest row."""
    seen: list[torch.Tensor] = []

    def keep(_m: Any, _a: Any, out: Any) -> None:
        seen.append((out[0] if isinstance(out, tuple) else out).detach().clone())

    parts = [model.model.embed_tokens, *model.model.layers, model.model.norm, model.lm_head]
    handles = [p.register_forward_hook(keep) for p in parts]
    length = int(batch["attention_mask"].sum(-1).max())
    try:
        with torch.no_grad():
            model(
                input_ids=batch["token_ids"][:, :length],
                attention_mask=batch["attention_mask"][:, :length].long(),
                position_ids=batch["position_ids"][:, :length],
                use_cache=False,
            )
    finally:
        for h in handles:
            h.remove()
    return seen


def scoring_rows(states: list[torch.Tensor], active_mask: torch.Tensor) -> list[torch.Tensor]:
    """Per state, the rows at ``t - 1`` for every active ``t`` (row-major)."""
    length = int(states[0].shape[1])
    select = active_mask[:, 1:length]
    return [s[:, :-1][select] for s in states]


def digests16(states: torch.Tensor) -> list[bytes]:
    """Per row: the first 16 bytes of SHA-256 over the dtype name, a NUL and the row's bytes."""
    tag = str(states.dtype).encode() + b"\0"
    raw = states.contiguous().view(torch.uint8).reshape(states.shape[0], -1).numpy()
    return [hashlib.sha256(tag + row.tobytes()).digest()[:16] for row in raw]
