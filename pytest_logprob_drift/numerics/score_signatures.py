"""The drift signatures of a verdict's three score tensors, as both writers seal them and the
offline check recomputes them (``numerics.signatures.step_signatures`` on their float64 copies)."""

from __future__ import annotations

import torch

from pytest_logprob_drift.numerics.signature_record import SealedSignature
from pytest_logprob_drift.numerics.signatures import step_signatures


def signatures(
    training: torch.Tensor, rollout: torch.Tensor, active: torch.Tensor
) -> tuple[SealedSignature, ...]:
    """The step and sample scope signatures of the verdict's three tensors (in float64 on the
    CPU, so those sealed at execution are those ``verify`` recomputes from token_diffs.pt)."""
    return tuple(
        step_signatures(
            training.detach().cpu().to(torch.float64).numpy(),
            rollout.detach().cpu().to(torch.float64).numpy(),
            active.detach().cpu().to(torch.bool).numpy(),
        )
    )
