"""Offline check of an attempt's sealed replay diagnostics (``diagnostics.replay``).

Owns deciding whether ``score_rollout_prefill.pt`` / ``score_rollout_decode_replay.pt`` and
comparison.json's ``diagnostics.path_split`` agree: a replay file is sealed exactly when its
replay is recorded as run; it holds ``numerics.path_split.REPLAY_TENSORS`` on the grid of
``score_rollout.pt`` with its very masks; its token ids are the sampled ones (a replay of
other tokens is refused); and the figures recomputed from the sealed tensors
(``numerics.path_split.path_split``) equal the recorded ones. Used by ``check.resume`` (so
resume, ``verify`` and the report all apply it). Never writes anything; knows nothing about
engines.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from pytest_logprob_drift.numerics.comparison import (
    REPLAY_RAN,
    Diagnostics,
    PathSplitFigures,
    ReplayStatus,
    from_builtins,
)
from pytest_logprob_drift.numerics.path_split import REPLAY_TENSORS, bitwise_equal, path_split
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.seal import SealError

Tensors = Mapping[str, torch.Tensor]


def _check_file(name: str, replay: Tensors, rollout: Tensors) -> None:
    if set(replay) != REPLAY_TENSORS:
        raise SealError(name, f"expected tensors {sorted(REPLAY_TENSORS)}, found {sorted(replay)}")
    sampled = rollout["token_ids"]
    for key in ("logprobs", "token_ids", "attention_mask", "active_mask"):
        if tuple(replay[key].shape) != tuple(sampled.shape):
            raise SealError(
                name, f"{key} has shape {tuple(replay[key].shape)}, not {tuple(sampled.shape)}"
            )
    for key in ("attention_mask", "active_mask"):
        if replay[key].dtype != torch.bool or not torch.equal(replay[key], rollout[key]):
            raise SealError(name, f"{key} differs from {layout.SCORE_ROLLOUT}'s")
    if replay["token_ids"].dtype != torch.long or replay["logprobs"].dtype != torch.float32:
        raise SealError(name, "token_ids must be int64 and logprobs float32")
    differing = ((replay["token_ids"] != sampled) & rollout["attention_mask"]).nonzero()
    if differing.numel():
        row, position = (int(v) for v in differing[0])
        raise SealError(
            name,
            f"the replay scored token {int(replay['token_ids'][row, position])} at row {row}, "
            f"position {position}, where {int(sampled[row, position])} was sampled: refused",
        )
    outside = ~rollout["active_mask"]
    if not bool(bitwise_equal(replay["logprobs"][outside], torch.zeros(1)).all()):
        raise SealError(name, "logprobs outside the active mask must be 0.0")


def _present(name: str, status: ReplayStatus, sealed: Tensors | None) -> None:
    if status.ran and sealed is None:
        raise SealError(name, "comparison.json records the replay as run but it is not sealed")
    if not status.ran and sealed is not None:
        raise SealError(name, f"sealed, but comparison.json records the replay as {status.status}")


def check_path_split(
    recorded: Diagnostics,
    prefill: Tensors | None,
    decode_replay: Tensors | None,
    rollout: Tensors,
    training: Tensors,
) -> None:
    """Raise SealError naming the file at fault unless comparison.json's ``recorded``
    path split and the sealed replay files are consistent."""
    split = recorded.path_split
    if split is None:
        for name, sealed in (
            (layout.SCORE_ROLLOUT_PREFILL, prefill),
            (layout.SCORE_ROLLOUT_DECODE_REPLAY, decode_replay),
        ):
            if sealed is not None:
                raise SealError(name, "sealed, but comparison.json records no path split")
        return
    _present(layout.SCORE_ROLLOUT_PREFILL, split.prefill, prefill)
    _present(layout.SCORE_ROLLOUT_DECODE_REPLAY, split.decode_replay, decode_replay)
    for name, sealed in (
        (layout.SCORE_ROLLOUT_PREFILL, prefill),
        (layout.SCORE_ROLLOUT_DECODE_REPLAY, decode_replay),
    ):
        if sealed is not None:
            _check_file(name, sealed, rollout)
    if prefill is None:
        if split.figures is not None:
            raise SealError(layout.COMPARISON, "path split figures recorded without a prefill")
        return
    try:
        figures = path_split(
            decode=rollout["logprobs"],
            prefill=prefill["logprobs"],
            training=training["logprobs"],
            active=rollout["active_mask"],
            comparable=split.comparable,
            decode_replay=(
                decode_replay["logprobs"]
                if decode_replay is not None and split.decode_replay.status == REPLAY_RAN
                else None
            ),
        )
        recomputed = from_builtins(figures, PathSplitFigures)
    except ValueError as exc:
        raise SealError(layout.SCORE_ROLLOUT_PREFILL, str(exc)) from None
    if recomputed != split.figures:
        raise SealError(
            layout.SCORE_ROLLOUT_PREFILL,
            "the path split recomputed offline differs from comparison.json's",
        )
