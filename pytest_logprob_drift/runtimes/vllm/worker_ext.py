"""A vLLM worker extension: per-worker set-up the rollout engine needs on CPU.

Owns ``DriftWorkerExtension``, mixed into every vLLM worker through ``LLM(worker_extension_cls=
...)`` and called with ``collective_rpc``. ``enable_amx`` asks Linux for AMX tile permission
(``arch_prctl(ARCH_REQ_XCOMP_PERM)`` via torch) in the worker process: vLLM's CPU attention
picks its AMX kernel for bfloat16 whenever the CPU has AMX, but never requests the permission,
so the first AMX instruction dies with SIGILL unless some oneDNN call happened to request it
first (measured here: bf16 workers died with exit code -4 in 2 of 4 engine starts). Knows
nothing about cases or scoring; imported only inside vLLM worker processes.
"""

from __future__ import annotations


class DriftWorkerExtension:
    """Methods vLLM adds to each worker (called by name through ``collective_rpc``)."""

    def enable_amx(self) -> bool:
        import torch

        if not torch.cpu._is_amx_tile_supported():
            return False
        return bool(torch.cpu._init_amx())
