"""The engine pool: rollout engines and training scorers keyed by construction fingerprint.

Owns building each engine once per fingerprint, counting constructions (the evidence that
reuse works), and closing engines as soon as no remaining case needs them. Knows nothing about
cases, verdicts or any concrete runtime.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pytest_logprob_drift.execute.protocol import RolloutEngine, TrainingScorer


@dataclass
class EnginePool:
    """Engines keyed by construction fingerprint; built once, closed when no longer needed."""

    rollout: dict[str, RolloutEngine] = field(default_factory=dict)
    training: dict[str, TrainingScorer] = field(default_factory=dict)
    rollout_constructions: int = 0
    training_constructions: int = 0

    def rollout_engine(self, key: str, build: Callable[[], RolloutEngine]) -> RolloutEngine:
        if key not in self.rollout:
            self.rollout[key] = build()
            self.rollout_constructions += 1
        return self.rollout[key]

    def training_scorer(self, key: str, build: Callable[[], TrainingScorer]) -> TrainingScorer:
        if key not in self.training:
            self.training[key] = build()
            self.training_constructions += 1
        return self.training[key]

    def release_unneeded(self, rollout_keys: set[str], training_keys: set[str]) -> None:
        for key in [k for k in self.rollout if k not in rollout_keys]:
            self.rollout.pop(key).close()
        for key in [k for k in self.training if k not in training_keys]:
            self.training.pop(key).close()

    def close(self) -> None:
        self.release_unneeded(set(), set())
