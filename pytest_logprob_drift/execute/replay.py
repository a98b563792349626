"""The opt-in replay diagnostics of one case (``diagnostics.replay``): where the drift enters.

Owns what happens after a case's paired scoring when replay is on: the case's own rollout
engine scores its sampled sequences again on its prefill path (``PrefillReplay``) and, where it
can, forces them through its decode path again (``DecodeReplay``); each replay's token ids
must be the sampled ones; which pairs compare like with like (raw against processed logprobs,
``numerics.path_split.comparable_pairs``); the ``diagnostics.path_split`` entry of
comparison.json and the tensors sealed as ``score_rollout_prefill.pt`` /
``score_rollout_decode_replay.pt``. A replay an engine cannot do, or whose tokens differ, is
a diagnostic status (``replay_unavailable``) with the reason; one whose logprobs are not the
decode path's kind is ``replay_incomparable``; never a knob status, never a verdict. Knows no
concrete runtime and nothing about files beyond the layout's names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from pytest_logprob_drift.execute.protocol import (
    DecodeReplay,
    LogpKernel,
    PrefillReplay,
    ReplayOutput,
    ReplayUnavailable,
    RolloutEngine,
    RolloutOutput,
    TrainingOutput,
)
from pytest_logprob_drift.numerics.comparison import (
    REPLAY_INCOMPARABLE,
    REPLAY_RAN,
    REPLAY_UNAVAILABLE,
    ReplayStatus,
)
from pytest_logprob_drift.numerics.path_split import (
    comparable_pairs,
    path_split,
    processing_is_identity,
)
from pytest_logprob_drift.numerics.sampling import Truncation
from pytest_logprob_drift.records import JsonObject, JsonValue, ScoringIdentity
from pytest_logprob_drift.store import layout


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayResult:
    """comparison.json's ``path_split`` entry and the replay files to seal (name -> tensors)."""

    entry: JsonObject
    files: dict[str, dict[str, torch.Tensor]]


def _semantics(mode: object) -> str:
    return "processed" if mode in ("processed", "processed_logprobs") else "raw"


def _token_mismatch(replayed: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> str | None:
    """Where the replay's token ids differ from the sampled ones (None: nowhere)."""
    sampled, attention = batch["token_ids"], batch["attention_mask"].bool()
    if tuple(replayed.shape) != tuple(sampled.shape):
        return f"token grid {tuple(replayed.shape)} is not the sampled {tuple(sampled.shape)}"
    differing = ((replayed != sampled) & attention).nonzero()
    if differing.numel():
        row, position = (int(v) for v in differing[0])
        return (
            f"scored token {int(replayed[row, position])} at row {row}, position {position}, "
            f"where {int(sampled[row, position])} was sampled"
        )
    return None


def _run(
    engine: RolloutEngine,
    kind: type,
    method: str,
    identity: ScoringIdentity,
    batch: Mapping[str, torch.Tensor],
    batch_size: int,
    logp: LogpKernel | None,
) -> tuple[ReplayStatus, ReplayOutput | None]:
    """One replay: its output, or ``replay_unavailable`` with why."""
    if not isinstance(engine, kind):
        return ReplayStatus(
            status=REPLAY_UNAVAILABLE,
            reason=f"the rollout engine ({type(engine).__name__}) has no {method}",
        ), None
    try:
        out: ReplayOutput = getattr(engine, method)(
            identity, batch, batch_size=batch_size, logp=logp
        )
    except ReplayUnavailable as exc:
        return ReplayStatus(status=REPLAY_UNAVAILABLE, reason=exc.reason), None
    except (ValueError, RuntimeError) as exc:
        return ReplayStatus(status=REPLAY_UNAVAILABLE, reason=f"{method} failed: {exc}"), None
    wrong = _token_mismatch(out.token_ids, batch)
    if wrong is None and tuple(out.logprobs.shape) != tuple(batch["token_ids"].shape):
        wrong = f"logprob grid {tuple(out.logprobs.shape)} is not the sampled one"
    if wrong is not None:
        return ReplayStatus(
            status=REPLAY_UNAVAILABLE, reason=f"{method} refused: the replay {wrong}"
        ), None
    return ReplayStatus(status=REPLAY_RAN, evidence=dict(out.evidence)), out


def _sealed(out: ReplayOutput, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``numerics.path_split.REPLAY_TENSORS``."""
    return {
        "logprobs": out.logprobs.float().cpu(),
        "token_ids": out.token_ids.long().cpu(),
        "attention_mask": batch["attention_mask"],
        "active_mask": batch["active_mask"],
    }


def _incomparable(status: ReplayStatus, what: str, kind: str, decode: str) -> ReplayStatus:
    return ReplayStatus(
        status=REPLAY_INCOMPARABLE,
        evidence=status.evidence,
        reason=(
            f"the {what} reports {kind} logprobs and the decode path {decode} ones, under "
            "sampling that processes the logits (temperature or truncation): not compared"
        ),
    )


def replay_diagnostics(
    engine: RolloutEngine,
    identity: ScoringIdentity,
    rollout: RolloutOutput,
    training: TrainingOutput,
    read_back: Mapping[str, JsonValue],
    *,
    batch_size: int,
    logp: LogpKernel | None,
) -> ReplayResult:
    """Both replays on the case's own engine, the comparability of each pair, the figures."""
    batch = rollout.tensors
    decode = _semantics(read_back.get("rollout.logprobs_mode"))
    trained = _semantics(read_back.get("training.logprob_semantics"))
    identical = processing_is_identity(Truncation.of(identity.sampling))
    prefill_status, prefill = _run(
        engine, PrefillReplay, "replay_prefill", identity, batch, batch_size, logp
    )
    replay_status, replayed = _run(
        engine, DecodeReplay, "replay_decode", identity, batch, batch_size, logp
    )
    prefill_kind = _semantics((prefill_status.evidence or {}).get("logprob_semantics", "raw"))
    comparable = comparable_pairs(
        decode=decode, prefill=prefill_kind, training=trained, identity_processing=identical
    )
    if prefill is None:
        comparable = {**comparable, "decode_prefill": False, "prefill_training": False}
    elif not comparable["decode_prefill"]:
        prefill_status = _incomparable(prefill_status, "prefill replay", prefill_kind, decode)
    replay_kind = _semantics((replay_status.evidence or {}).get("logprob_semantics", "raw"))
    if replayed is not None and not (identical or replay_kind == decode):
        replay_status = _incomparable(replay_status, "decode replay", replay_kind, decode)
    files: dict[str, dict[str, torch.Tensor]] = {}
    figures = None
    if prefill is not None:
        files[layout.SCORE_ROLLOUT_PREFILL] = _sealed(prefill, batch)
        figures = path_split(
            decode=batch["logprobs"],
            prefill=prefill.logprobs,
            training=training.logprobs,
            active=batch["active_mask"],
            comparable=comparable,
            decode_replay=(
                replayed.logprobs
                if replayed is not None and replay_status.status == REPLAY_RAN
                else None
            ),
        )
    if replayed is not None:
        files[layout.SCORE_ROLLOUT_DECODE_REPLAY] = _sealed(replayed, batch)
    entry = {
        "prefill": prefill_status.to_json(),
        "decode_replay": replay_status.to_json(),
        "comparable": comparable,
        "figures": figures,
    }
    return ReplayResult(entry=entry, files=files)
