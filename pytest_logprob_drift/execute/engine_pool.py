"""The engine pool: rollout engines and training scorers keyed by construction fingerprint.

Owns building each engine once per fingerprint, counting constructions (the evidence that
reuse works), and closing engines as soon as no remaining case needs them. Safe to share
between the runner's engine groups running side by side: the groups own disjoint
fingerprints, the pool's tables are guarded by a lock, and an engine is built outside it (a
slow build in one group never waits on another). Knows nothing about cases, verdicts or any
concrete runtime.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pytest_logprob_drift.execute.protocol import RolloutEngine, TrainingScorer


@dataclass
class EnginePool:
    """Engines keyed by construction fingerprint; built once, closed when no longer needed."""

    rollout: dict[str, RolloutEngine] = field(default_factory=dict)
    training: dict[str, TrainingScorer] = field(default_factory=dict)
    rollout_constructions: int = 0
    training_constructions: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def rollout_engine(self, key: str, build: Callable[[], RolloutEngine]) -> RolloutEngine:
        with self._lock:
            engine = self.rollout.get(key)
        if engine is None:
            engine = build()
            with self._lock:
                self.rollout[key] = engine
                self.rollout_constructions += 1
        return engine

    def training_scorer(self, key: str, build: Callable[[], TrainingScorer]) -> TrainingScorer:
        with self._lock:
            scorer = self.training.get(key)
        if scorer is None:
            scorer = build()
            with self._lock:
                self.training[key] = scorer
                self.training_constructions += 1
        return scorer

    def release_unneeded(self, rollout_keys: set[str], training_keys: set[str]) -> None:
        with self._lock:
            rollout_gone = [k for k in self.rollout if k not in rollout_keys]
            training_gone = [k for k in self.training if k not in training_keys]
        self.release(rollout_gone, training_gone)

    def release(self, rollout_keys: Iterable[str], training_keys: Iterable[str]) -> None:
        """Close exactly these engines (those present)."""
        with self._lock:
            rollout = [self.rollout.pop(k) for k in list(rollout_keys) if k in self.rollout]
            training = [self.training.pop(k) for k in list(training_keys) if k in self.training]
        for engine in rollout:
            engine.close()
        for scorer in training:
            scorer.close()

    def close(self) -> None:
        self.release_unneeded(set(), set())
