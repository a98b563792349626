"""The protocol between the FSDP scorer group (parent) and its rank processes.

Owns every message that crosses a rank's private channel, as named frozen records: the
parent's requests (``Init``, ``Score``, ``CaptureLayers``, ``GatherWeights``, ``Close``) and
the ranks' replies (``Ready``, ``Scored``, ``LayersCaptured``, ``WeightsGathered``,
``Failed``) with their evidence, and how they
cross: each rank has its own duplex ``multiprocessing`` channel, inherited as the file
descriptor that ``CHANNEL_FD_ENV`` names (POSIX); the records themselves travel over it,
tensors inside them as bytes of the project's one tensor wire format (``tensorio``, read back
weights-only); whatever arrives that is not a message of the expected direction is refused
with ``ProtocolError``. Knows nothing about processes, torch.distributed, models, sharding or
what the scores are compared with (the sampler's ``Truncation`` record travels as it is).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import ClassVar

from torch import Tensor

from pytest_logprob_drift.numerics.sampling import Truncation
from pytest_logprob_drift.records import JsonValue
from pytest_logprob_drift.tensorio import tensor_bytes, tensors_from_bytes

__all__ = [
    "CHANNEL_FD_ENV",
    "CaptureLayers",
    "Close",
    "Failed",
    "GatherWeights",
    "Init",
    "LayersCaptured",
    "ProtocolError",
    "Ready",
    "ReadyEvidence",
    "Reply",
    "Request",
    "Score",
    "ScoreEvidence",
    "Scored",
    "WeightsGathered",
    "full_vocab_bytes",
    "layers_bytes",
    "receive_reply",
    "receive_request",
    "result_bytes",
    "send",
]

CHANNEL_FD_ENV = "LOGPROB_DRIFT_RANK_FD"
"""Names, in a rank's environment, the inherited file descriptor of its end of the channel."""


class ProtocolError(Exception):
    """Something arrived on a rank channel that is not a message of the expected direction."""


# --------------------------------------------------------------------------- parent -> rank


@dataclass(frozen=True, slots=True, kw_only=True)
class Init:
    """First message to every rank: what to load and how to run."""

    model_dir: str
    dtype: str
    attn_implementation: str
    device: str
    op_timeout_s: float
    threads: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Score:
    """Score ``batch`` (canonical tensors as wire bytes) with the named selected-logprob fn.

    ``processed``: score the sampler's processed logits (temperature and truncation, as
    ``numerics.sampling`` applies them) instead of the raw ones; ``lm_head_dtype``: ``float32``
    computes the LM head and logits in float32 from upcast hidden states, ``compute`` leaves
    them in the model's dtype; ``full_vocabulary``: rank 0 also returns the scored ``[A, V]``
    rows of the active positions (float32)."""

    batch: bytes
    batch_size: int
    logp_backend: str
    processed: Truncation | None = None
    lm_head_dtype: str = "compute"
    full_vocabulary: bool = False

    @classmethod
    def of(
        cls,
        batch: Mapping[str, Tensor],
        *,
        batch_size: int,
        logp_backend: str,
        processed: Truncation | None = None,
        lm_head_dtype: str = "compute",
        full_vocabulary: bool = False,
    ) -> Score:
        return cls(
            batch=tensor_bytes(batch),
            batch_size=batch_size,
            logp_backend=logp_backend,
            processed=processed,
            lm_head_dtype=lm_head_dtype,
            full_vocabulary=full_vocabulary,
        )

    def tensors(self) -> dict[str, Tensor]:
        return tensors_from_bytes(self.batch)


@dataclass(frozen=True, slots=True, kw_only=True)
class CaptureLayers:
    """Run the teacher-forced forward of ``batch`` (canonical tensors as wire bytes) once more
    with the layer diagnostics' hooks and reduce the states in the rank
    (``layer_capture.capture_layers``); ``lm_head_dtype`` as in ``Score``. Only the reduction
    crosses back, never a hidden state."""

    batch: bytes
    batch_size: int
    lm_head_dtype: str = "compute"

    @classmethod
    def of(
        cls, batch: Mapping[str, Tensor], *, batch_size: int, lm_head_dtype: str = "compute"
    ) -> CaptureLayers:
        return cls(batch=tensor_bytes(batch), batch_size=batch_size, lm_head_dtype=lm_head_dtype)

    def tensors(self) -> dict[str, Tensor]:
        return tensors_from_bytes(self.batch)


@dataclass(frozen=True, slots=True, kw_only=True)
class GatherWeights:
    """Gather the sharded model's parameters and persistent buffers whole (``full_tensor()``
    on every rank, a collective) for a push into the rollout engine."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Close:
    """Leave the process group and exit."""


Request = Init | Score | CaptureLayers | GatherWeights | Close

# --------------------------------------------------------------------------- rank -> parent


@dataclass(frozen=True, slots=True, kw_only=True)
class _FromRank:
    KIND: ClassVar[str] = ""

    rank: int
    pid: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadyEvidence:
    """What one rank read back from its live, sharded model after loading it."""

    param_dtype: str
    attn_implementation: str
    device: str
    num_parameters: int
    local_param_numel: int
    param_placements: tuple[str, ...]
    device_mesh: str
    sharded_modules: tuple[str, ...]
    world_size: int
    backend: str
    startup_s: Mapping[str, float]
    weights: Mapping[str, JsonValue] | None = None
    """The rank's digests of its model, gathered (``runtimes.weights.module_digests``): whole
    digests on rank 0 only."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Ready(_FromRank):
    KIND: ClassVar[str] = "ready"

    evidence: ReadyEvidence


@dataclass(frozen=True, slots=True, kw_only=True)
class ScoreEvidence:
    """What one rank observed while scoring: its group, its result digest, its guard."""

    world_size: int
    backend: str
    result_sha256: str
    state_digest_before: str
    state_digest_after: str
    forward_calls: int
    readonly_violations: tuple[str, ...]
    logprob_semantics: str = "raw"
    """``raw`` or ``processed``: which logits this rank's scores were taken from."""
    logits_dtype: str = ""
    """The dtype of the logits the LM head produced, observed at its output."""
    full_vocab_rows: int = 0
    """How many full-vocabulary rows this rank scored (0 unless the request asked)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Scored(_FromRank):
    """``logprobs`` holds the result's wire bytes on rank 0 only (``None`` elsewhere);
    ``full_vocab`` the scored ``[A, V]`` float32 rows, on rank 0 and only when asked for."""

    KIND: ClassVar[str] = "scored"

    logprobs: bytes | None
    evidence: ScoreEvidence
    full_vocab: bytes | None = None

    def result(self) -> Tensor:
        if self.logprobs is None:
            raise ProtocolError(f"rank {self.rank} sent no result tensor")
        return tensors_from_bytes(self.logprobs)["logprobs"]

    def full_vocab_rows(self) -> Tensor:
        if self.full_vocab is None:
            raise ProtocolError(f"rank {self.rank} sent no full-vocabulary rows")
        return tensors_from_bytes(self.full_vocab)["full_vocab"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LayersCaptured(_FromRank):
    """One rank's layer capture: ``reduction`` holds the reduction's wire bytes
    (``layers_bytes``) on rank 0 only (``None`` elsewhere); ``reduction_sha256`` is, on every
    rank, the SHA-256 of the bytes that rank computed (every rank runs the full batch)."""

    KIND: ClassVar[str] = "layers"

    reduction: bytes | None
    reduction_sha256: str

    def tensors(self) -> dict[str, Tensor]:
        """The reduction rank 0 sent, after checking its bytes against its own digest."""
        if self.reduction is None:
            raise ProtocolError(f"rank {self.rank} sent no layer reduction")
        if hashlib.sha256(self.reduction).hexdigest() != self.reduction_sha256:
            raise ProtocolError(f"rank {self.rank}'s layer reduction differs from its digest")
        return tensors_from_bytes(self.reduction)


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightsGathered(_FromRank):
    """One rank's gathered state: ``state`` holds its wire bytes on rank 0 only (``None``
    elsewhere); ``state_sha256`` is, on every rank, the SHA-256 of the bytes that rank
    gathered (every rank holds the whole state after ``full_tensor()``)."""

    KIND: ClassVar[str] = "weights"

    state: bytes | None
    state_sha256: str
    gather_s: float

    def tensors(self) -> dict[str, Tensor]:
        """The state rank 0 sent, after checking its bytes against its own digest."""
        if self.state is None:
            raise ProtocolError(f"rank {self.rank} sent no gathered state")
        if hashlib.sha256(self.state).hexdigest() != self.state_sha256:
            raise ProtocolError(f"rank {self.rank}'s gathered state differs from its digest")
        return tensors_from_bytes(self.state)


@dataclass(frozen=True, slots=True, kw_only=True)
class Failed(_FromRank):
    """The rank's request failed; ``traceback`` is its own text."""

    KIND: ClassVar[str] = "error"

    traceback: str


Reply = Ready | Scored | LayersCaptured | WeightsGathered | Failed


def result_bytes(logprobs: Tensor) -> bytes:
    """The wire bytes of a rank's result (what ``Scored.logprobs`` carries)."""
    return tensor_bytes({"logprobs": logprobs})


def full_vocab_bytes(rows: Tensor) -> bytes:
    """The wire bytes of a rank's full-vocabulary rows (what ``Scored.full_vocab`` carries)."""
    return tensor_bytes({"full_vocab": rows})


def layers_bytes(reduction: Mapping[str, Tensor]) -> bytes:
    """The wire bytes of a rank's layer reduction (what ``LayersCaptured.reduction`` carries)."""
    return tensor_bytes(reduction)


# --------------------------------------------------------------------------- the pipe


def send(conn: Connection, message: Request | Reply) -> None:
    conn.send(message)


def receive_request(conn: Connection) -> Request:
    message = conn.recv()
    if not isinstance(message, Init | Score | CaptureLayers | GatherWeights | Close):
        raise ProtocolError(f"expected a request, got {type(message).__name__}")
    return message


def receive_reply(conn: Connection) -> Reply:
    message = conn.recv()
    if not isinstance(message, Ready | Scored | LayersCaptured | WeightsGathered | Failed):
        raise ProtocolError(f"expected a reply, got {type(message).__name__}")
    return message
