"""The attention layout of a checkpoint, known before anything executes.

Owns ``AttentionLayout`` (a checkpoint's model type, attention and KV head counts and MLA
latent rank, and where they were read) and ``attention_layout``: for a built-in checkpoint
(``name://``) what its runtime declares, for a local checkpoint directory what its
``config.json`` says (top level, or ``text_config`` for a multimodal wrapper), or why it
cannot be known (no such file yet, unreadable, not a JSON object). What a runtime can run for
a given layout (context parallelism needs MLA on vLLM 0.32) is the runtime's declaration
(``records.ContextParallelRule``); this module only reads. Never imports torch or a runtime.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from pytest_logprob_drift.config.input_file import InputFileError, read_input
from pytest_logprob_drift.config.limits import CONFIG_JSON_LIMIT

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from pytest_logprob_drift.records import BuiltinCheckpoint


class AttentionLayout:
    """What a checkpoint's attention is, and where that was read (``source``). A plain class,
    as ``config.limits.CheckpointLimits``."""

    __slots__ = ("attention_heads", "kv_heads", "kv_lora_rank", "model_type", "source")

    def __init__(
        self,
        *,
        source: str,
        model_type: str | None = None,
        attention_heads: int | None = None,
        kv_heads: int | None = None,
        kv_lora_rank: int | None = None,
    ) -> None:
        self.source = source
        self.model_type = model_type
        self.attention_heads = attention_heads
        self.kv_heads = kv_heads
        self.kv_lora_rank = kv_lora_rank

    @property
    def mla(self) -> bool:
        """Multi-head latent attention: the config declares a ``kv_lora_rank`` (how vLLM's
        ``ModelConfig.use_mla`` tells an MLA model, with its list of model types)."""
        return self.kv_lora_rank is not None

    def describe(self) -> str:
        """E.g. ``/m/config.json: model_type 'qwen3', 32 attention heads, 8 KV heads (GQA),
        no kv_lora_rank (not MLA)``."""
        parts = [f"model_type {self.model_type!r}" if self.model_type else "no model_type"]
        if self.attention_heads is not None:
            parts.append(f"{self.attention_heads} attention heads")
        if self.kv_heads is not None:
            kind = (
                "MHA"
                if self.attention_heads == self.kv_heads
                else "MQA"
                if self.kv_heads == 1
                else "GQA"
            )
            parts.append(f"{self.kv_heads} KV heads ({kind})")
        parts.append(
            f"kv_lora_rank {self.kv_lora_rank} (MLA)" if self.mla else "no kv_lora_rank (not MLA)"
        )
        return f"{self.source}: {', '.join(parts)}"


def _positive(section: Mapping[str, object], name: str) -> int | None:
    value = section.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def attention_layout(uri: str, builtin: Mapping[str, BuiltinCheckpoint]) -> AttentionLayout | str:
    """The attention layout of checkpoint ``uri``, or why it cannot be known now (a
    sentence naming the file). ``builtin``: the built-in checkpoints a runtime declares."""
    known = builtin.get(uri)
    if known is not None:
        if known.attention_heads is None or known.kv_heads is None:
            return f"the built-in checkpoint {uri!r} declares no attention layout"
        return AttentionLayout(
            source=f"{uri} (declared)",
            model_type=known.model_type,
            attention_heads=known.attention_heads,
            kv_heads=known.kv_heads,
        )
    if "://" in uri:
        return f"{uri!r} is no local checkpoint directory and no built-in checkpoint"
    config = Path(uri) / "config.json"
    try:
        document = json.loads(read_input(config, CONFIG_JSON_LIMIT))
    except (FileNotFoundError, NotADirectoryError):
        return f"{config} does not exist (yet)"
    except (InputFileError, OSError, ValueError, RecursionError) as exc:
        return f"{config} cannot be read ({exc.__class__.__name__})"
    if not isinstance(document, dict):
        return f"{config} is not a JSON object"
    nested = document.get("text_config")
    section: Mapping[str, object] = nested if isinstance(nested, dict) else document
    heads = _positive(section, "num_attention_heads")
    kv = _positive(section, "num_key_value_heads") or heads
    rank = section.get("kv_lora_rank")
    model_type = section.get("model_type") or document.get("model_type")
    return AttentionLayout(
        source=str(config),
        model_type=str(model_type) if model_type is not None else None,
        attention_heads=heads,
        kv_heads=kv,
        kv_lora_rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
    )
