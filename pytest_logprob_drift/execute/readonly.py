"""The read-only training-scorer guard, enforced rather than assumed.

Owns the checks around one teacher-forced scoring call on an ``nn.Module``: parameters and
buffers bitwise unchanged (a SHA-256 per tensor before and after), every submodule's
train/eval mode restored, no gradients produced, no ``generate`` call, and no KV cache
(``use_cache``/``past_key_values`` seen by the forward) where the identity forbids one. Used
in-process by runtimes and inside FSDP rank processes alike (where a parameter is a DTensor,
its local shard is what is digested). Knows nothing about verdicts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch


def tensor_digest(tensor: torch.Tensor) -> str:
    """SHA-256 of the bytes held here: a DTensor (FSDP) is digested as its local shard.

    DTensor is recognised by its ``to_local`` rather than imported: importing
    ``torch.distributed.tensor`` registers torch operator libraries, which must not happen
    again in a process that re-imports modules (pytester's in-process runs)."""
    to_local = getattr(tensor, "to_local", None)
    local: torch.Tensor = to_local() if callable(to_local) else tensor
    data = local.detach().cpu().contiguous().reshape(-1)
    digest = hashlib.sha256(f"{data.dtype}:{tuple(local.shape)}:".encode())
    digest.update(data.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def state_digests(module: torch.nn.Module) -> dict[str, str]:
    digests = {f"param:{n}": tensor_digest(p) for n, p in module.named_parameters()}
    digests.update({f"buffer:{n}": tensor_digest(b) for n, b in module.named_buffers()})
    return digests


def state_digest(module: torch.nn.Module) -> str:
    """One digest of every parameter and buffer (name, dtype, shape, bytes)."""
    digest = hashlib.sha256()
    for name, value in sorted(state_digests(module).items()):
        digest.update(f"{name}={value};".encode())
    return digest.hexdigest()


def _modes(module: torch.nn.Module) -> dict[str, bool]:
    return {name or "<root>": m.training for name, m in module.named_modules()}


class ReadOnlyGuard:
    """Use ``with guard.watch():`` around the scoring call, then read ``violations``."""

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        kv_cache_allowed: bool,
        settle: Callable[[], None] | None = None,
    ) -> None:
        self.module = module
        self.kv_cache_allowed = kv_cache_allowed
        self.settle = settle
        """Called before each snapshot, e.g. to reshard FSDP parameters so shards are compared
        with shards, never with all-gathered copies."""
        self.violations: list[str] = []
        self.digest_before = ""
        self.digest_after = ""
        self.forward_calls = 0

    @contextmanager
    def watch(self) -> Iterator[ReadOnlyGuard]:
        module = self.module
        if self.settle is not None:
            self.settle()
        before = state_digests(module)
        modes = _modes(module)
        grads_before = {n for n, p in module.named_parameters() if p.grad is not None}
        seen_cache: list[str] = []

        def pre_hook(_m: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
            self.forward_calls += 1
            if kwargs.get("use_cache"):
                seen_cache.append("use_cache=True")
            if kwargs.get("past_key_values") is not None:
                seen_cache.append("past_key_values passed")

        handle = module.register_forward_pre_hook(pre_hook, with_kwargs=True)
        generate_calls: list[int] = []
        original_generate = module.__dict__.get("generate")
        if hasattr(module, "generate"):

            def refuse_generate(*args: Any, **kwargs: Any) -> Any:
                generate_calls.append(1)
                raise RuntimeError("the training scorer must not generate")

            module.generate = refuse_generate  # type: ignore[assignment]
        try:
            yield self
        finally:
            handle.remove()
            if original_generate is not None:
                module.generate = original_generate
            elif "generate" in module.__dict__:
                del module.__dict__["generate"]
            if self.settle is not None:
                self.settle()
            after = state_digests(module)
            changed = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
            if changed:
                self.violations.append(
                    f"parameters/buffers changed during scoring: {', '.join(changed[:5])}"
                )
            mode_changes = sorted(n for n, t in _modes(module).items() if modes.get(n) != t)
            if mode_changes:
                self.violations.append(
                    f"module mode not restored for {', '.join(mode_changes[:5])}"
                    f" (was {'train' if modes[mode_changes[0]] else 'eval'})"
                )
            grads = {n for n, p in module.named_parameters() if p.grad is not None}
            if grads - grads_before:
                self.violations.append("gradients were produced during scoring")
            if generate_calls:
                self.violations.append("generate() was called by the training scorer")
            if seen_cache and not self.kv_cache_allowed:
                self.violations.append(
                    f"KV cache used where the identity forbids it ({seen_cache[0]})"
                )
            self.digest_before = hashlib.sha256(repr(sorted(before.items())).encode()).hexdigest()
            self.digest_after = hashlib.sha256(repr(sorted(after.items())).encode()).hexdigest()
