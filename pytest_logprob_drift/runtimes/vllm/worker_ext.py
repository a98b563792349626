"""A vLLM worker extension: per-worker set-up and per-worker facts the rollout engine needs.

Owns ``DriftWorkerExtension``, mixed into every vLLM worker through ``LLM(worker_extension_cls=
...)`` and called with ``collective_rpc``. ``enable_amx`` asks Linux for AMX tile permission
(``arch_prctl(ARCH_REQ_XCOMP_PERM)`` via torch) in the worker process: vLLM's CPU attention
picks its AMX kernel for bfloat16 whenever the CPU has AMX, but never requests the permission,
so the first AMX instruction dies with SIGILL unless some oneDNN call happened to request it
first (measured here: bf16 workers died with exit code -4 in 2 of 4 engine starts).
``model_report`` returns what this worker's loaded model really is, read from the attributes of
vLLM's own layer objects: the attention implementation class of every attention layer and the
vocabulary shard (sizes and ``shard_indices``) of the embedding and the LM head.

Knows nothing about cases, knobs, scoring, how the report is summarised, or the engine's
processes; imported only inside vLLM worker processes, where vLLM and torch are loaded.
"""

from __future__ import annotations

from typing import Any

_VOCAB_LAYERS = ("embed_tokens", "lm_head")


class DriftWorkerExtension:
    """Methods vLLM adds to each worker (called by name through ``collective_rpc``)."""

    def enable_amx(self) -> bool:
        import torch

        if not torch.cpu._is_amx_tile_supported():
            return False
        return bool(torch.cpu._init_amx())

    def model_report(self) -> dict[str, Any]:
        """This worker's attention implementations and vocabulary shards (plain values only).

        ``attention_backends``: sorted class names of ``layer.impl`` over the model's attention
        layers (``AttentionLayerBase``). ``vocab``: for the first ``VocabParallelEmbedding``
        named ``embed_tokens`` and the first named ``lm_head``, the layer's tensor-parallel
        rank and size, its original and padded vocabulary sizes, its rows per rank and its
        ``shard_indices`` (the padded rows and the real token ids this rank owns).
        """
        from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

        worker: Any = self  # the vLLM worker this class is mixed into
        model = worker.get_model()
        backends: set[str] = set()
        vocab: dict[str, dict[str, int]] = {}
        for name, module in model.named_modules():
            if isinstance(module, AttentionLayerBase):
                impl = getattr(module, "impl", None)
                if impl is not None:
                    backends.add(type(impl).__name__)
            leaf = name.rsplit(".", 1)[-1]
            if leaf in _VOCAB_LAYERS and leaf not in vocab:
                if isinstance(module, VocabParallelEmbedding):
                    shard = module.shard_indices
                    vocab[leaf] = {
                        "tp_rank": int(module.tp_rank),
                        "tp_size": int(module.tp_size),
                        "org_vocab_size": int(module.org_vocab_size),
                        "num_embeddings_padded": int(module.num_embeddings_padded),
                        "num_embeddings_per_partition": int(module.num_embeddings_per_partition),
                        "padded_org_vocab_start_index": int(shard.padded_org_vocab_start_index),
                        "padded_org_vocab_end_index": int(shard.padded_org_vocab_end_index),
                        "org_vocab_start_index": int(shard.org_vocab_start_index),
                        "org_vocab_end_index": int(shard.org_vocab_end_index),
                    }
        return {"attention_backends": sorted(backends), "vocab": vocab}
