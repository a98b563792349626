"""The importance-sampling diagnostic's attribution contribution: each case's ESS.

Owns the attribution document's optional per-case field ``ess`` (the normalized ESS of the
case's raw token weights exp(training - rollout), ``numerics.importance_sampling``'s one
definition, from the same sealed scores the effect is computed from) and how ``verify`` treats
documents sealed before the field existed: a document none of whose cases records it is
compared without it, so it still verifies; one that records it anywhere must record it, equal
to the recomputation, everywhere. The ranking never reads it: it stays the ranking by effect
on the drift. ``CONTRIBUTION`` is what ``attribution.analysis`` calls through the registry.
Knows nothing about how the document is sealed or shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
from msgspec import UNSET

from pytest_logprob_drift.numerics.importance_sampling import importance_sampling

if TYPE_CHECKING:
    import torch

    from pytest_logprob_drift.attribution.analysis import Compared, SealedExecution
    from pytest_logprob_drift.attribution.document import Attribution
    from pytest_logprob_drift.records import JsonObject

ESS_KEY = "ess"


def case_ess(training: torch.Tensor, rollout: torch.Tensor, active: torch.Tensor) -> float:
    """The normalized ESS of one case's active tokens (on the CPU, as ``verify`` recomputes)."""
    return importance_sampling(training.cpu(), rollout.cpu(), active.cpu()).ess


def as_recorded(recorded: Attribution, recomputed: Attribution) -> Attribution:
    """``recomputed`` as a document of ``recorded``'s form: without the per-case ESS when
    ``recorded`` (sealed before the field existed) has it on none of its cases."""
    if any(case.ess is not UNSET for case in recorded.cases):
        return recomputed
    return msgspec.structs.replace(
        recomputed, cases=[msgspec.structs.replace(c, ess=UNSET) for c in recomputed.cases]
    )


@dataclass(frozen=True, slots=True)
class ImportanceContribution:
    """Each attributed case's ``ess`` (``AttributionContribution``)."""

    def noise_floor(
        self, baseline: SealedExecution, repeats: Sequence[SealedExecution]
    ) -> object | None:
        return None

    def floor_members(self, floor: object | None) -> JsonObject:
        return {}

    def comparison_members(self, compared: Compared, floor: object | None) -> JsonObject:
        return {}

    def case_members(self, case: SealedExecution) -> JsonObject:
        rollout = case.rollout
        return {
            ESS_KEY: case_ess(case.training_logprobs, rollout["logprobs"], rollout["active_mask"])
        }

    def as_recorded(self, recorded: Attribution, recomputed: Attribution) -> Attribution:
        return as_recorded(recorded, recomputed)


CONTRIBUTION = ImportanceContribution()
