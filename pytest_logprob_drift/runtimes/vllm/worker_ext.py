"""A vLLM worker extension: per-worker set-up and per-worker facts the rollout engine needs.

Owns ``DriftWorkerExtension``, mixed into every vLLM worker through ``LLM(worker_extension_cls=
...)`` and called with ``collective_rpc``. ``enable_amx`` asks Linux for AMX tile permission
(``arch_prctl(ARCH_REQ_XCOMP_PERM)`` via torch) in the worker process: vLLM's CPU attention
picks its AMX kernel for bfloat16 whenever the CPU has AMX, but never requests the permission,
so the first AMX instruction dies with SIGILL unless some oneDNN call happened to request it
first (measured here: bf16 workers died with exit code -4 in 2 of 4 engine starts).
``model_report`` returns what this worker's loaded model really is, read from the attributes of
vLLM's own layer objects: the attention implementation class of every attention layer and the
vocabulary shard (sizes and ``shard_indices``) of the embedding and the LM head, the LM head
weight's dtype, and the sampling parameters (temperature, top_p, top_k, min_p) of every request
the worker's input batch took in, counted by a probe on vLLM's ``InputBatch.add_request``: what
the running engine applied, which ``RequestOutput`` does not carry.

Knows nothing about cases, knobs, scoring, how the report is summarised, or the engine's
processes; imported only inside vLLM worker processes, where vLLM and torch are loaded.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

_VOCAB_LAYERS = ("embed_tokens", "lm_head")

_SAMPLING_SEEN: Counter[tuple[float, float, int, float]] = Counter()
"""``(temperature, top_p, top_k, min_p)`` of every request this worker's input batch took in
(the ``SamplingParams`` the worker really received, after the hop from the frontend), with
how often; never reset, so a caller compares two reports to see one call's requests."""


def _install_sampling_probe() -> bool:
    """Wrap vLLM's ``InputBatch.add_request`` in this worker process (once) so that the
    sampling parameters of each request entering the batch are counted in ``_SAMPLING_SEEN``:
    the values the sampler and the min_p logits processor (``MinPLogitsProcessor``, fed from
    the same ``request.sampling_params``) apply. Changes nothing the request does."""
    from vllm.v1.worker import gpu_input_batch

    batch_type: Any = gpu_input_batch.InputBatch
    if getattr(batch_type.add_request, "_drift_probe", False):
        return True
    original = batch_type.add_request

    def add_request(self: Any, request: Any) -> Any:
        params = getattr(request, "sampling_params", None)
        if params is not None:
            key = (
                float(params.temperature),
                float(params.top_p),
                int(params.top_k),
                float(params.min_p),
            )
            _SAMPLING_SEEN[key] += 1
        return original(self, request)

    add_request._drift_probe = True  # type: ignore[attr-defined]
    batch_type.add_request = add_request
    return True


class DriftWorkerExtension:
    """Methods vLLM adds to each worker (called by name through ``collective_rpc``)."""

    def enable_amx(self) -> bool:
        """Called in every worker before any request: AMX permission (and, as the one
        per-worker set-up call, the sampling probe)."""
        import torch

        _install_sampling_probe()

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
        ``lm_head_dtype``: the dtype of the loaded LM head's weight (``none`` without one).
        ``sampling_seen``: the sampling parameters of the requests this worker's input batch
        took in so far (``_install_sampling_probe``), with their counts.
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
        head = next(
            (m for n, m in model.named_modules() if n.rsplit(".", 1)[-1] == "lm_head"), None
        )
        weight = getattr(head, "weight", None)
        head_dtype = str(weight.dtype).removeprefix("torch.") if weight is not None else "none"
        return {
            "sampling_probe": _install_sampling_probe(),
            "sampling_seen": [
                {"temperature": t, "top_p": p, "top_k": k, "min_p": m, "requests": n}
                for (t, p, k, m), n in sorted(_SAMPLING_SEEN.items())
            ],
            "attention_backends": sorted(backends),
            "vocab": vocab,
            "lm_head_dtype": head_dtype,
        }
