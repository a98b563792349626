"""The persisted layout: the name of every file of an attempt, of an attribution and of a run.

Owns the names and where they sit, nothing else (the pattern of pytest's cacheprovider, which
maps keys to paths in one place): every other module asks this one for a name or a path. The
sets that readers check (the JSON files, the tensor files, what a COMPLETE may cover) are
derived here from the names. Torch-free and import-light: planning and collection may import it.
Knows nothing about seals, hashing, parsing or what the files contain.

A run directory ``<artifacts>/<experiment_id>/``::

    experiment.json            the experiment as planned (sealed by seals/)
    plan.jsonl                 one canonical row per planned case, append-only (sealed by seals/)
    seals/run-<bytes>.json     one run seal per append (``run-<bytes>-<key id>.json`` re-sealed)
    .lock                      the writer's lock
    cases/<case_id>/<attempt_id>/   one attempt: ATTEMPT_FILES, COMPLETE written last
    attributions/<id>/         attribution.json, COMPLETE
    engine-logs/               vLLM's and transformers' own output (never sealed)
    report-<attempt>.html      the report page (never sealed)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

COMPLETE = "COMPLETE"
"""The seal of an attempt or an attribution: a manifest of every other file, written last."""

# ----------------------------------------------------------------------------- an attempt

REQUESTED = "requested.json"
MATERIALIZED = "materialized.json"
ACTUAL = "actual.json"
IDENTITY = "identity.json"
COMPARISON = "comparison.json"
SCORE_ROLLOUT = "score_rollout.pt"
SCORE_TRAINING = "score_training.pt"
TOKEN_DIFFS = "token_diffs.pt"
DIVERGENCE = "divergence.pt"
"""Opt-in full-vocabulary diagnostics (``diagnostics.full_vocabulary``)."""
SCORE_ROLLOUT_PREFILL = "score_rollout_prefill.pt"
"""Opt-in replay (``diagnostics.replay``): the rollout engine's prefill replay of its sampled
sequences, on ``score_rollout.pt``'s grid."""
SCORE_ROLLOUT_DECODE_REPLAY = "score_rollout_decode_replay.pt"
"""Opt-in replay: the rollout's forced decode of its sampled tokens, where the engine has one."""
REPLAY_FILES = (SCORE_ROLLOUT_PREFILL, SCORE_ROLLOUT_DECODE_REPLAY)
LAYERS_TRAINING = "layers_training.pt"
"""Opt-in layer diagnostics (``diagnostics.layers``): the training side's reduced states
(``numerics.layer_reduction``)."""
LAYERS_ROLLOUT = "layers_rollout.pt"
"""Opt-in layer diagnostics: the rollout side's reduced states, from its prefill path."""
LAYER_FILES = (LAYERS_TRAINING, LAYERS_ROLLOUT)
ROUTING_TRAINING = "routing_training.pt"
"""Opt-in routing diagnostics (``diagnostics.routing``): the experts the training side chose per
MoE layer, teacher-forced (``numerics.routing``)."""
ROUTING_ROLLOUT = "routing_rollout.pt"
"""Opt-in routing diagnostics: the experts the rollout engine chose while it generated."""
ROUTING_FILES = (ROUTING_TRAINING, ROUTING_ROLLOUT)
IMPORTED = "imported.json"
"""An imported step (``logprob-drift import``): where each row of the token grid came from in
the production run's own files (``store.documents.ImportedStep``); absent from executed
attempts."""

WEIGHTS_ROLLOUT = "weights_rollout.json"
"""The rollout side's weight digests per checkpoint tensor (``store.documents.WeightsDocument``),
sealed where the runtime reports them."""
WEIGHTS_TRAINING = "weights_training.json"
"""The training side's weight digests per checkpoint tensor."""
WEIGHTS_FILES = (WEIGHTS_ROLLOUT, WEIGHTS_TRAINING)

RECORD_FILES = (REQUESTED, MATERIALIZED, ACTUAL, IDENTITY)
"""The JSON records every attempt seals beside its comparison (requested -> materialized ->
actual, and the identity both sides scored)."""
SCORE_FILES = (SCORE_ROLLOUT, SCORE_TRAINING, TOKEN_DIFFS)
"""The tensors of an attempt that has scores (PASS, MISMATCH, ZERO_ACTIVE_TOKENS)."""
DIAGNOSTIC_FILES = (DIVERGENCE, *REPLAY_FILES, *LAYER_FILES, *ROUTING_FILES)
"""Tensor files of opt-in diagnostics: sealed when the diagnostic ran, absent otherwise."""
OPTIONAL_DOCUMENTS = (IMPORTED, *WEIGHTS_FILES)
"""JSON documents an attempt seals only when it is of their kind (an imported step) or its
runtime reports them (weight digests)."""
JSON_FILES = (COMPARISON, *RECORD_FILES, *OPTIONAL_DOCUMENTS)
TENSOR_FILES = (*SCORE_FILES, *DIAGNOSTIC_FILES)
ATTEMPT_FILES = frozenset((*JSON_FILES, *TENSOR_FILES))
"""Every name an attempt's COMPLETE may cover."""

# ----------------------------------------------------------------------------- a run

EXPERIMENT = "experiment.json"
PLAN = "plan.jsonl"
LOCK = ".lock"
SEALS = "seals"
CASES = "cases"
ATTRIBUTIONS = "attributions"
ATTRIBUTION = "attribution.json"
"""The one document of an attribution directory, beside its COMPLETE."""
ENGINE_LOGS = "engine-logs"
RUN_SEAL = re.compile(r"run-([0-9]{12})(?:-[0-9a-f]{16})?\.json")
"""Names of run seals: ``run-<bytes of plan.jsonl sealed, 12 digits>.json``, or
``run-<bytes>-<key id>.json`` when a seal key re-seals bytes that an unkeyed (or otherwise
keyed) seal already covers."""
REPORT_PAGE = re.compile(r"report-.+\.html")


def run_seal_name(plan_bytes: int, key_id: str | None = None) -> str:
    """``seals/``'s name for a seal of the first ``plan_bytes`` bytes of plan.jsonl."""
    suffix = f"-{key_id}" if key_id else ""
    return f"run-{plan_bytes:012d}{suffix}.json"


def report_page_name(newest_attempt: str | None) -> str:
    """The default report page of a run whose newest shown attempt is ``newest_attempt``."""
    return f"report-{newest_attempt or 'empty'}.html"


@dataclass(frozen=True, slots=True)
class RunLayout:
    """Paths inside one run directory (``directory``: ``<artifacts>/<experiment_id>``)."""

    directory: Path

    @property
    def experiment(self) -> Path:
        return self.directory / EXPERIMENT

    @property
    def plan(self) -> Path:
        return self.directory / PLAN

    @property
    def lock(self) -> Path:
        return self.directory / LOCK

    @property
    def seals(self) -> Path:
        return self.directory / SEALS

    @property
    def cases(self) -> Path:
        return self.directory / CASES

    @property
    def attributions(self) -> Path:
        return self.directory / ATTRIBUTIONS

    @property
    def engine_logs(self) -> Path:
        return self.directory / ENGINE_LOGS

    def case(self, case_id: str) -> Path:
        return self.cases / case_id

    def attempt(self, case_id: str, attempt_id: str) -> Path:
        return self.cases / case_id / attempt_id

    def attribution(self, attribution_id: str) -> Path:
        return self.attributions / attribution_id
