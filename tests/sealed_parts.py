"""A sealed run with every optional part, in seconds, for the hardening tests (test support).

The ``cpu-smoke`` runtime seals no layer or replay files: its engines have no layer capture
and no replay. ``PartsAdapter`` is the smoke adapter whose rollout engine also replays its
sampled sequences (``replay_prefill``: the synthetic model's teacher-forced forward;
``replay_decode``: its incremental decode path, forced through the sampled tokens) and whose
two sides capture the synthetic model's states (embeddings, the pre-activation sum as the one
"decoder layer", the hidden state as the final norm, the logits), reduced by
``numerics.layer_reduction`` exactly as the real runtimes reduce theirs. Its environment is
the smoke runtime's, so ``run --runtime cpu-smoke`` resumes its attempts (and executes again,
without layers or replay, a case whose attempt is invalid).

``sealed_run`` runs the S0 smoke experiment (plus ``rollout.dtype=bfloat16``, so the two
sides' states differ) with ``diagnostics.layers`` (3 positions per row) and
``diagnostics.replay`` through the real ``run`` command in this process, with the smoke
runtime's adapter swapped for this one for the duration: every judged attempt seals
comparison.json's layer, path split and importance-sampling parts and the files
``layers_training.pt``, ``layers_rollout.pt``, ``score_rollout_prefill.pt`` and
``score_rollout_decode_replay.pt``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_logprob_drift.execute.protocol import (
    LogpKernel,
    ReplayOutput,
    RuntimeBinding,
    TensorBatch,
)
from pytest_logprob_drift.numerics.layer_reduction import reduce_states, stack_reductions
from pytest_logprob_drift.records import ScoringIdentity
from pytest_logprob_drift.runtimes.smoke import runtime as smoke
from tests.drift_testing import OFFSET_EXPECT, S0, cli

EXPERIMENT = "s0-sealed-parts"
CONFIG_DIAGNOSTICS = {"layers": {"positions_per_row": 3}, "replay": True}
RUN_FLAGS = (
    "--runtime",
    "cpu-smoke",
    "--allow-smoke-operators",
    "--expect",
    OFFSET_EXPECT,
    "--expect",
    "rollout.dtype=bfloat16=MISMATCH",
)


def _states(model: smoke.SyntheticCausalModel, batch: TensorBatch) -> list[torch.Tensor]:
    """``[B, L, width]`` per state of one teacher-forced forward (as the model's forward)."""
    token_ids, attention = batch["token_ids"], batch["attention_mask"]
    with torch.no_grad():
        emb = model.embed[token_ids] * attention.unsqueeze(-1).to(model.embed.dtype)
        counts = attention.to(model.embed.dtype).cumsum(-1).clamp(min=1).unsqueeze(-1)
        summed = emb + emb.cumsum(1) / counts
        hidden = torch.tanh(summed) * model.scale
        logits = torch.stack([sequence @ model.head for sequence in hidden])
    return [emb, summed, hidden, logits]


def _capture(model: smoke.SyntheticCausalModel, batch: TensorBatch) -> dict[str, torch.Tensor]:
    """The reduction of every state at ``t - 1`` for each active ``t`` (row-major)."""
    select = batch["active_mask"][:, 1:]
    per_state = [[reduce_states(s[:, :-1][select])] for s in _states(model, batch)]
    return stack_reductions(per_state, select.nonzero().to(torch.long))


def _kernel(logp: LogpKernel | None) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    return logp or smoke.native_selected_logprob


class PartsRollout(smoke.SyntheticRollout):
    """The synthetic rollout engine with both replays and a layer capture."""

    def replay_prefill(
        self,
        identity: ScoringIdentity,
        rollout: TensorBatch,
        *,
        batch_size: int,
        logp: LogpKernel | None,
    ) -> ReplayOutput:
        token_ids, active = rollout["token_ids"], rollout["active_mask"]
        with torch.no_grad():
            logits = self.model(token_ids, rollout["attention_mask"])
        scores = _kernel(logp)(logits[:, :-1], token_ids[:, 1:])
        out = torch.zeros(token_ids.shape, dtype=torch.float32)
        out[:, 1:] = torch.where(active[:, 1:], scores.float(), torch.zeros(()))
        return ReplayOutput(
            logprobs=out, token_ids=token_ids.clone(), evidence={"path": "teacher_forced"}
        )

    def replay_decode(
        self,
        identity: ScoringIdentity,
        rollout: TensorBatch,
        *,
        batch_size: int,
        logp: LogpKernel | None,
    ) -> ReplayOutput:
        token_ids, active = rollout["token_ids"], rollout["active_mask"]
        out = torch.zeros(token_ids.shape, dtype=torch.float32)
        kernel = _kernel(logp)
        with torch.no_grad():
            for row in range(int(token_ids.shape[0])):
                running = torch.zeros(smoke.HIDDEN, dtype=self.model.embed.dtype)
                length = int(rollout["attention_mask"][row].sum())
                for t in range(length - 1):
                    logits, running = self.model.step(
                        token_ids[row, t], running, torch.tensor(float(t + 1))
                    )
                    if bool(active[row, t + 1]):
                        chosen = token_ids[row, t + 1].reshape(1)
                        out[row, t + 1] = float(kernel(logits.unsqueeze(0), chosen)[0])
        return ReplayOutput(
            logprobs=out, token_ids=token_ids.clone(), evidence={"path": "running_sum"}
        )

    def capture_layers(
        self, identity: ScoringIdentity, rollout: TensorBatch, *, batch_size: int
    ) -> Mapping[str, Any]:
        return _capture(self.model, rollout)


class PartsScorer(smoke.StatelessScorer):
    """The stateless scorer with a layer capture."""

    def capture_layers(
        self, identity: ScoringIdentity, rollout: TensorBatch, *, batch_size: int
    ) -> Mapping[str, Any]:
        return _capture(self.model, rollout)


class PartsAdapter(smoke.CpuSmokeAdapter):
    """The smoke adapter building the engines above (the same environment)."""

    def build_rollout(self, binding: RuntimeBinding, identity: ScoringIdentity) -> PartsRollout:
        self._check_identity(identity)
        return PartsRollout(binding)

    def build_training(self, binding: RuntimeBinding, identity: ScoringIdentity) -> PartsScorer:
        self._check_identity(identity)
        return PartsScorer(binding)


def config(directory: Path) -> Path:
    """The S0 smoke experiment with ``rollout.dtype=bfloat16`` and every optional part."""
    document = json.loads(S0.read_text())
    document["experiment_id"] = EXPERIMENT
    document["interventions"] = [
        *document["interventions"],
        {"path": "rollout.dtype", "values": ["bfloat16"]},
    ]
    document["diagnostics"] = CONFIG_DIAGNOSTICS
    path = directory / "sealed-parts.json"
    path.write_text(json.dumps(document))
    return path


def run_command(artifacts: Path, config_path: Path) -> tuple[str | Path, ...]:
    """``run`` of ``config_path`` into ``artifacts`` (``--json``)."""
    return ("run", config_path, *RUN_FLAGS, "--artifacts", artifacts, "--json")


def sealed_run(directory: Path) -> Path:
    """The run directory of the experiment above, sealed by ``PartsAdapter``."""
    config_path = config(directory)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(smoke, "CpuSmokeAdapter", PartsAdapter)
        code, _out, err = cli(*run_command(directory / "runs", config_path))
    assert code == 0, (code, _out[-3000:], err[-3000:])
    run_dir = directory / "runs" / EXPERIMENT
    for complete in (run_dir / "cases").glob("*/*/COMPLETE"):
        files = json.loads(complete.read_text())["files"]
        for name in (
            "layers_training.pt",
            "layers_rollout.pt",
            "score_rollout_prefill.pt",
            "score_rollout_decode_replay.pt",
        ):
            assert name in files, (complete, sorted(files))
    return run_dir
