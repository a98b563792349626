"""The deep tiny Qwen3 (``tiny://qwen3-deep-l8-h64-v1``): built deterministically from code,
8 decoder layers with head_dim 64, the tiny one's tokenizer, and the tiny one untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from pytest_logprob_drift.runtimes import TINY_QWEN3, TINY_QWEN3_DEEP
from pytest_logprob_drift.runtimes.tiny_model import (
    DEEP_LAYERS,
    TINY_QWEN3_DEEP_NAME,
    TINY_QWEN3_NAME,
    TINY_SCHEME,
    CheckpointError,
    build_tiny_checkpoint,
    checkpoint_digest,
    resolve_checkpoint,
)

pytestmark = pytest.mark.slow


def test_the_deep_checkpoint_is_deterministic_deep_and_distinct(tmp_path: Path) -> None:
    deep = resolve_checkpoint(
        TINY_SCHEME + TINY_QWEN3_DEEP_NAME, expected_digest=None, cache_root=tmp_path / "c"
    )
    assert deep.uri == TINY_QWEN3_DEEP.uri
    assert deep.path.name == f"tiny-{TINY_QWEN3_DEEP_NAME}-{deep.digest[:16]}"
    build_tiny_checkpoint(tmp_path / "again", layers=DEEP_LAYERS)
    assert checkpoint_digest(tmp_path / "again") == deep.digest
    config = json.loads((deep.path / "config.json").read_text())
    assert config["num_hidden_layers"] == DEEP_LAYERS >= 8
    assert config["head_dim"] == 64
    assert config["vocab_size"] == TINY_QWEN3_DEEP.vocab_size
    assert config["max_position_embeddings"] == TINY_QWEN3_DEEP.max_positions
    tiny = resolve_checkpoint(TINY_QWEN3.uri, expected_digest=None, cache_root=tmp_path / "c")
    assert json.loads((tiny.path / "config.json").read_text())["num_hidden_layers"] == 2
    # The tiny checkpoint's bytes are what the 2-layer builder gives (its digest unchanged).
    build_tiny_checkpoint(tmp_path / "tiny")
    assert checkpoint_digest(tmp_path / "tiny") == tiny.digest != deep.digest
    assert (tiny.path / "tokenizer.json").read_bytes() == (
        deep.path / "tokenizer.json"
    ).read_bytes()
    with pytest.raises(CheckpointError, match=TINY_QWEN3_DEEP_NAME):
        resolve_checkpoint(TINY_SCHEME + "nope", expected_digest=None, cache_root=tmp_path / "c")
    assert TINY_QWEN3_NAME != TINY_QWEN3_DEEP_NAME
