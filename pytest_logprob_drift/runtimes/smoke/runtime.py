"""The CPU-only smoke runtime (``--runtime cpu-smoke``): synthetic model, stateless scorer.

Owns a deterministic synthetic causal model (seeded torch weights; each position's hidden state
mixes its token embedding with the running mean of the prefix), a rollout engine that samples
incrementally with a running-sum state (the KV-cache analogue) and reports the sampled tokens'
logprobs, and a read-only training scorer that teacher-forces the whole sequence through
``torch.func.functional_call`` (stateless). Knobs it truly applies: batch.size (chunking),
rollout.dtype and training.compute_dtype (the weights are cast), logp.backend. Topology,
caching, graphs, attention implementation and sharding cannot change anything here: their
records say so (``applied`` only for the single value this runtime inherently has, otherwise
``unsupported``). The scorer's steps are methods (inputs, forward, inside-the-guard, output) so
the framework's own tests can subclass it with deliberate defects; none ship here. Passing S0
proves framework plumbing only. Knows nothing about planning, artifacts or frontends.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from pytest_logprob_drift.errors import RuntimeFailure
from pytest_logprob_drift.execute.protocol import (
    LogpKernel,
    Materialized,
    RolloutOutput,
    RuntimeBinding,
    TensorBatch,
    TrainingOutput,
    backend_of,
    side_identity,
)
from pytest_logprob_drift.execute.readonly import ReadOnlyGuard, state_digest
from pytest_logprob_drift.records import ApplicationStatus, JSONScalar, KnobValue, ScoringIdentity
from pytest_logprob_drift.runtimes.batch import active_rows, canonical_batch
from pytest_logprob_drift.runtimes.materialization import Evidence, always, applied

VOCAB = 64
HIDDEN = 32
EOS_ID = 0
PAD_ID = 0
SYNTHETIC_URI = "synthetic://cpu-smoke/v1"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Knobs with the only value this runtime inherently has.
INHERENT: Mapping[str, KnobValue] = {
    "rollout.tensor_parallel_size": 1,
    "rollout.context_parallel_size": 1,
    "rollout.enable_prefix_caching": False,
    "rollout.enforce_eager": True,
    "training.sharding": "none",
    "rollout.logprobs_mode": "raw_logprobs",
    "training.logprob_semantics": "raw",
    "training.lm_head_dtype": "compute",
}


class SyntheticCausalModel(torch.nn.Module):
    """Deterministic tiny causal model: logits_t = W tanh(E[x_t] + mean(E[x_<=t]))."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.embed = torch.nn.Parameter(torch.randn(VOCAB, HIDDEN, generator=generator))
        self.head = torch.nn.Parameter(torch.randn(HIDDEN, VOCAB, generator=generator) * 0.8)
        self.scale: torch.Tensor
        self.register_buffer("scale", torch.ones(()))

    def forward(
        self, token_ids: torch.Tensor, attention_mask: torch.Tensor, use_cache: bool = False
    ) -> torch.Tensor:
        emb = self.embed[token_ids] * attention_mask.unsqueeze(-1).to(self.embed.dtype)
        counts = attention_mask.to(self.embed.dtype).cumsum(-1).clamp(min=1).unsqueeze(-1)
        prefix_mean = emb.cumsum(1) / counts
        hidden = torch.tanh(emb + prefix_mean) * self.scale
        # One (T, H) @ (H, V) product per sequence, never one over the whole batch: BLAS picks
        # its kernel (and so its rounding) by the product's shape, so a batched product could
        # round a sample differently for another batch size on some CPUs. Per sequence, a
        # sample's logits are bitwise the same for every batch size, on any CPU.
        logits: torch.Tensor = torch.stack([sequence @ self.head for sequence in hidden])
        return logits

    def step(
        self, token: torch.Tensor, running_sum: torch.Tensor, count: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Incremental decode: one position from the running prefix sum (cache analogue)."""
        emb = self.embed[token]
        running_sum = running_sum + emb
        count = count.to(emb.dtype)  # a float32 count would promote bf16/fp16 state to fp32
        hidden = torch.tanh(emb + running_sum / count.unsqueeze(-1)) * self.scale
        return hidden @ self.head, running_sum


def native_selected_logprob(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """What a side that does not upcast does: log_softmax in the logits' dtype."""
    return torch.log_softmax(logits, -1).gather(-1, token_ids.unsqueeze(-1)).squeeze(-1).float()


def _side_identity(identity: ScoringIdentity) -> dict[str, JSONScalar]:
    # A synthetic model has no files to digest: it reports the identity's own digest.
    return side_identity(identity, checkpoint_digest=identity.checkpoint.digest)


class SyntheticRollout:
    def __init__(self, binding: RuntimeBinding) -> None:
        self.construction_fingerprint = binding.rollout_construction_fingerprint
        self.dtype_name = binding.rollout_settings.dtype.value
        self.model = SyntheticCausalModel().to(DTYPES[self.dtype_name]).eval()
        self.last_chunk = 0
        self.backend_used = ""
        self.full_vocabulary = binding.full_vocabulary is not None

    def generate(
        self, identity: ScoringIdentity, *, batch_size: int, logp: LogpKernel | None
    ) -> RolloutOutput:
        kernel: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = (
            logp or native_selected_logprob
        )
        self.backend_used = backend_of(logp)
        prompts = identity.prompts.token_ids
        rows: list[tuple[list[int], list[int], list[float]]] = []
        steps: list[list[torch.Tensor]] = []
        self.last_chunk = batch_size
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            for offset, prompt in enumerate(chunk):
                steps.append([])
                rows.append(
                    self._sample_one(list(prompt), start + offset, identity, kernel, steps[-1])
                )
        tensors = canonical_batch(
            [p for p, _, _ in rows],
            [(r, lp) for _, r, lp in rows],
            PAD_ID,
            eos_token_id=EOS_ID,
            mask_policy=identity.mask_policy,
        )
        return RolloutOutput(
            tensors=tensors,
            identity=_side_identity(identity),
            full_vocab=active_rows(steps, tensors["active_mask"]) if self.full_vocabulary else None,
        )

    @torch.no_grad()
    def _sample_one(
        self,
        prompt: list[int],
        index: int,
        identity: ScoringIdentity,
        kernel: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        steps: list[torch.Tensor],
    ) -> tuple[list[int], list[int], list[float]]:
        sampling = identity.sampling
        generator = torch.Generator().manual_seed(sampling.seed * 1_000_003 + index)
        running = torch.zeros(HIDDEN, dtype=self.model.embed.dtype)
        logits = torch.zeros(VOCAB)
        for position, token in enumerate(prompt):
            logits, running = self.model.step(
                torch.tensor(token), running, torch.tensor(float(position + 1))
            )
        response: list[int] = []
        logprobs: list[float] = []
        for _ in range(sampling.max_new_tokens):
            if sampling.temperature == 0:
                token = int(logits.float().argmax())
            else:
                probs = torch.softmax(logits.float() / sampling.temperature, -1)
                token = int(torch.multinomial(probs, 1, generator=generator))
            logprobs.append(float(kernel(logits.unsqueeze(0), torch.tensor([token]))[0]))
            if self.full_vocabulary:
                steps.append(logits)
            response.append(token)
            if token == EOS_ID:
                break
            count = torch.tensor(float(len(prompt) + len(response)))
            logits, running = self.model.step(torch.tensor(token), running, count)
        return prompt, response, logprobs

    def read_back(self) -> Mapping[str, JSONScalar]:
        dtype = str(self.model.embed.dtype).removeprefix("torch.")
        return {
            "rollout.dtype": dtype,
            "batch.size": self.last_chunk,
            "logp.backend": self.backend_used,
            **{k: v for k, v in INHERENT.items() if k.startswith("rollout.")},
        }

    def close(self) -> None:
        del self.model


class StatelessScorer:
    """Read-only teacher-forced scorer over ``functional_call`` (parameters passed in)."""

    def __init__(self, binding: RuntimeBinding) -> None:
        self.construction_fingerprint = binding.training_construction_fingerprint
        self.dtype_name = binding.training_settings.compute_dtype.value
        self.model = SyntheticCausalModel().to(DTYPES[self.dtype_name]).eval()
        self.last_chunk = 0
        self.backend_used = ""
        self.full_vocabulary = binding.full_vocabulary is not None

    def score(
        self,
        identity: ScoringIdentity,
        rollout: TensorBatch,
        *,
        batch_size: int,
        logp: LogpKernel | None,
        rollout_routing: Any | None = None,
    ) -> TrainingOutput:
        if rollout_routing is not None:  # planning never hands it a replay case
            raise RuntimeFailure("the synthetic scorer has no mixture-of-experts router")
        kernel = logp or native_selected_logprob
        self.backend_used = backend_of(logp)
        consumed = self.inputs(rollout)
        token_ids, attention, active = (
            consumed["token_ids"],
            consumed["attention_mask"],
            consumed["active_mask"],
        )
        guard = ReadOnlyGuard(self.model, kv_cache_allowed=identity.training_kv_cache)
        out = torch.zeros(token_ids.shape, dtype=torch.float32)
        full: list[torch.Tensor] = []
        self.last_chunk = batch_size
        with guard.watch():
            params = {**dict(self.model.named_parameters()), **dict(self.model.named_buffers())}
            for start in range(0, token_ids.shape[0], batch_size):
                rows = slice(start, start + batch_size)
                with torch.no_grad():
                    logits = self.forward(params, token_ids[rows], attention[rows])
                scores = kernel(logits[:, :-1], token_ids[rows, 1:])
                out[rows, 1:] = scores * active[rows, 1:]
                if self.full_vocabulary:
                    full.append(logits[:, :-1][active[rows, 1:]])
            self.inside_guard()
        return TrainingOutput(
            logprobs=self.output(out, active),
            consumed=consumed,
            identity=_side_identity(identity),
            readonly_violations=tuple(guard.violations),
            evidence={
                "state_digest_before": guard.digest_before,
                "state_digest_after": guard.digest_after,
                "model_state_digest": state_digest(self.model),
                "forward_calls": guard.forward_calls,
            },
            full_vocab=torch.cat(full) if self.full_vocabulary and full else None,
        )

    def inputs(self, rollout: TensorBatch) -> dict[str, torch.Tensor]:
        """The tensors the scorer consumes: copies of the rollout's identity tensors."""
        return {
            name: rollout[name].clone()
            for name in ("token_ids", "attention_mask", "active_mask", "position_ids")
        }

    def forward(
        self, params: Mapping[str, torch.Tensor], token_ids: torch.Tensor, attention: torch.Tensor
    ) -> torch.Tensor:
        logits: torch.Tensor = torch.func.functional_call(
            self.model, dict(params), (token_ids, attention), {"use_cache": False}
        )
        return logits

    def inside_guard(self) -> None:
        """Runs while the read-only guard watches, after the last forward."""

    def output(self, logprobs: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        return logprobs

    def read_back(self) -> Mapping[str, JSONScalar]:
        dtype = str(self.model.embed.dtype).removeprefix("torch.")
        return {
            "training.compute_dtype": dtype,
            "batch.size": self.last_chunk,
            "logp.backend": self.backend_used,
            **{k: v for k, v in INHERENT.items() if k.startswith("training.")},
        }

    def close(self) -> None:
        del self.model


def _cannot_apply(path: str, value: KnobValue) -> Materialized:
    return Materialized(
        value=None,
        status=ApplicationStatus.UNSUPPORTED,
        evidence=f"the synthetic runtime cannot apply {path}={value!r}",
    )


def _inherent(only: KnobValue) -> Evidence:
    def state(path: str, value: KnobValue) -> Materialized:
        if value == only:
            return applied(value, "the only value a single-process synthetic runtime has")
        return _cannot_apply(path, value)

    return state


MATERIALIZATION: Mapping[str, Evidence] = {
    "batch.size": always("prompts are processed in chunks of this size on both sides"),
    "rollout.dtype": always("synthetic weights are cast to this dtype"),
    "training.compute_dtype": always("synthetic weights are cast to this dtype"),
    "logp.backend": always("the bound kernel computes both sides' selected logprobs"),
    **{path: _inherent(value) for path, value in INHERENT.items()},
}
"""What the synthetic runtime does with each knob; any other is unsupported."""


class CpuSmokeAdapter:
    """RuntimeAdapter for the synthetic CPU smoke runtime."""

    name = "cpu-smoke"

    def materialize(self, requested: Mapping[str, KnobValue]) -> Mapping[str, Materialized]:
        return {
            path: MATERIALIZATION.get(path, _cannot_apply)(path, value)
            for path, value in requested.items()
        }

    def build_rollout(self, binding: RuntimeBinding, identity: ScoringIdentity) -> SyntheticRollout:
        self._check_identity(identity)
        return SyntheticRollout(binding)

    def build_training(self, binding: RuntimeBinding, identity: ScoringIdentity) -> StatelessScorer:
        self._check_identity(identity)
        return StatelessScorer(binding)

    @staticmethod
    def _check_identity(identity: ScoringIdentity) -> None:
        if identity.checkpoint.uri != SYNTHETIC_URI:
            from pytest_logprob_drift.errors import UsageError

            raise UsageError(
                f"runtime cpu-smoke only serves checkpoint {SYNTHETIC_URI!r}, "
                f"config names {identity.checkpoint.uri!r}"
            )
        too_big = [t for row in identity.prompts.token_ids for t in row if t >= VOCAB]
        if too_big:
            from pytest_logprob_drift.errors import UsageError

            raise UsageError(
                f"runtime cpu-smoke has a vocabulary of {VOCAB}; prompt token "
                f"{too_big[0]} is out of range"
            )

    def environment(self, identity: ScoringIdentity) -> Mapping[str, str]:
        return {"runtime": "cpu-smoke", "synthetic_model": "v1"}

    def close(self) -> None:
        return None
