"""The one handle this package keeps on the transformers library.

Owns the untyped view of ``transformers`` (its annotations are partial, so the parts used here
are treated as ``Any``) and the quiet context in which checkpoints are loaded and saved (no
progress bars on the terminal, the caller's setting restored afterwards). Knows nothing about
checkpoints, engines, scoring, cases or pytest.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import transformers
from transformers.utils import logging as _hf_logging

tf: Any = transformers
hf_logging: Any = _hf_logging


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
