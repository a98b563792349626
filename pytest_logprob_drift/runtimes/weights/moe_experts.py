"""Which weight tensors are a mixture-of-experts model's experts, left out of the weight check.

Owns the one rule both sides' weight reports follow until the experts' layouts are mapped:
a tensor under an ``experts`` module (a checkpoint's per-expert
``mlp.experts.3.gate_proj.weight``, transformers 5's fused ``mlp.experts.gate_up_proj``,
vLLM's ``mlp.experts.w13_weight``) is listed as skipped with ``EXPERTS_NOT_CHECKED``; the
rest of the model, the router (``mlp.gate.weight``) included, is checked as before.
Knows nothing about engines, comparison or sealing.
"""

from __future__ import annotations

import re
from typing import Final

EXPERTS_NOT_CHECKED: Final = "MoE experts: not checked yet"
"""The reason both sides give for an expert tensor they did not check."""

_EXPERTS: Final = re.compile(r"(?:^|\.)experts\.")


def is_expert_tensor(name: str) -> bool:
    """Whether ``name`` (a checkpoint, transformers or vLLM parameter name) lies under an
    ``experts`` module."""
    return _EXPERTS.search(name) is not None
