"""The one handle this package keeps on the transformers library.

Owns the untyped view of ``transformers`` (its annotations are partial, so the parts used here
are treated as ``Any``) and the quiet context in which checkpoints are loaded and saved (no
progress bars on the terminal, the caller's setting restored afterwards), and the one lock every
model construction in this package holds. Knows nothing about checkpoints, engines, scoring,
cases or pytest.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import transformers
from transformers.utils import logging as _hf_logging

tf: Any = transformers
hf_logging: Any = _hf_logging

# transformers 5 swaps a class attribute while ``from_pretrained`` builds a model
# (``initialization.no_tie_weights`` sets ``PreTrainedModel.tie_weights`` to a no-op and puts
# back what it saw). Two threads building at once (the runner's case groups do) can put back
# the no-op: every later model of the process then keeps a tied LM head untied, on the meta
# device. Measured: four threads loading the tiny Qwen2 three times each left it so.
_CONSTRUCTION = threading.Lock()


@contextmanager
def model_construction() -> Iterator[None]:
    """Hold the process's model-construction lock (one ``from_pretrained`` or model build at a
    time, whatever the thread) with transformers' progress bars off inside the block."""
    with _CONSTRUCTION, quiet_progress_bars():
        yield


@contextmanager
def quiet_progress_bars() -> Iterator[None]:
    """Disable transformers' progress bars inside the block; restore them if they were on."""
    were_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if were_enabled:
            hf_logging.enable_progress_bar()
