"""Which tokens a detailed case's per-sample token view shows, read from its sealed tensors.

Owns the view's limits and choosing within them: at most ``MAX_SAMPLES`` samples per case
(every sample when there are no more; else the samples a caller requires, an imported step's
worst, then those with the largest max |diff|, shown in sample order) and at most
``MAX_TOKENS`` of each sample's response (active) tokens: all of them when they fit, else a
window that starts ``LEAD`` tokens before the sample's first mismatch (from the first token
when it has none, never past its last). Each shown token keeps its id and both sides' logprobs
as sealed: ``float32`` when both sides' dtypes are exact in it (float32, bfloat16, float16),
else ``float64``, so the page recomputes |diff| and the mismatch rule (|training - rollout| >
threshold, in float64) from exactly the values the verdict judged. The decoded text of each
shown id comes through the decoder the frontend hands in. Knows nothing about how the view is
drawn.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from pytest_logprob_drift.report.model import SampleTokens, TokenView

MAX_SAMPLES = 8
MAX_TOKENS = 256
LEAD = 16
"""Tokens shown before a sample's first mismatch when its response is longer than the view."""
EXACT_IN_FLOAT32 = (torch.float32, torch.bfloat16, torch.float16)


def limits_note() -> str:
    """The view's limits in words (printed on the page)."""
    return (
        f"Tokens by sample: at most {MAX_SAMPLES} samples per detailed case (with more, the "
        f"{MAX_SAMPLES} with the largest max |diff|) and at most {MAX_TOKENS} response tokens "
        f"per sample (for a longer response, from {LEAD} tokens before its first mismatch); "
        "each token coloured by |diff| on the histograms' log axis, mismatches outlined, the "
        "first mismatch of each sample marked; hover or focus a token for both logprobs, "
        "|diff| and its id."
    )


def _window(length: int, first: int | None) -> tuple[int, int]:
    """``[start, stop)`` of the shown tokens among a sample's ``length`` active tokens."""
    if length <= MAX_TOKENS:
        return 0, length
    start = 0 if first is None else max(0, min(first - LEAD, length - MAX_TOKENS))
    return start, start + MAX_TOKENS


def token_view(
    *,
    token_ids: torch.Tensor,
    rollout: torch.Tensor,
    training: torch.Tensor,
    active: torch.Tensor,
    starts: torch.Tensor,
    threshold: float,
    texts: Callable[[Sequence[int]], list[str] | None],
    required: Sequence[int] = (),
) -> TokenView | None:
    """The view of one case: ``rollout``/``training`` the sealed logprobs ``[B, T]`` in their
    sealed dtype; ``starts`` each sample's first response column; ``texts`` the decoded text
    of distinct ids (None: ids are shown); ``required`` samples shown whatever their max
    |diff| (an imported step's worst samples, ``report.steps``), the others chosen as
    always."""
    if not math.isfinite(threshold):  # nothing to colour or judge against
        return None
    exact32 = rollout.dtype in EXACT_IN_FLOAT32 and training.dtype in EXACT_IN_FLOAT32
    dtype = np.float32 if exact32 else np.float64
    diff = (training.to(torch.float64) - rollout.to(torch.float64)).abs()
    peaks = torch.where(active, diff, torch.tensor(-1.0, dtype=torch.float64)).amax(dim=1)
    present = [i for i in range(int(active.shape[0])) if bool(active[i].any())]
    if not present:
        return None
    must = [i for i in dict.fromkeys(required) if i in present][:MAX_SAMPLES]
    others = sorted((i for i in present if i not in must), key=lambda i: (-float(peaks[i]), i))
    chosen = [*must, *others][:MAX_SAMPLES]
    samples = []
    for i in sorted(chosen):
        columns = active[i].nonzero().flatten()
        over = (diff[i, columns] > threshold).nonzero().flatten()
        first_index = int(over[0]) if over.numel() else None
        lo, hi = _window(int(columns.numel()), first_index)
        shown = columns[lo:hi]
        positions = (shown - starts[i]).numpy().astype(np.int64)
        samples.append(
            SampleTokens(
                sample=i,
                length=int(columns.numel()),
                positions=positions,
                token_ids=token_ids[i, shown].numpy().astype(np.int64),
                rollout=rollout[i, shown].to(torch.float64).numpy().astype(dtype),
                training=training[i, shown].to(torch.float64).numpy().astype(dtype),
                first_mismatch=None
                if first_index is None
                else int(columns[first_index] - starts[i]),
            )
        )
    distinct = sorted({int(t) for s in samples for t in s.token_ids})
    decoded = texts(distinct)
    return TokenView(
        samples=tuple(samples),
        total_samples=len(present),
        texts=dict(zip(distinct, map(str, decoded), strict=True)) if decoded is not None else {},
        threshold=threshold,
        required=tuple(must),
    )
