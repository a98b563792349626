"""Weight digests: what each side holds, per checkpoint tensor, as SHA-256 of row-major bytes.

Owns the digest of one tensor (``digest``), the checkpoint's own digests read from its
safetensors files (``checkpoint``), the training side's digests of a live module
(``module_digests``, FSDP gathered) and the vLLM side's mapping of its fused, sharded,
padded layout back to the checkpoint's names (``vllm_layout``). The comparison of a side's
digests with the checkpoint's, which ``verify`` recomputes from sealed documents, is torch-free
and lives in ``check.weights_check``. Every submodule imports torch; none is imported at
planning time.
"""
