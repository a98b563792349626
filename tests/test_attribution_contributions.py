"""The attribution document's diagnostic members come from the installed diagnostics (issue 52):
each built-in diagnostic's ``attribution`` contribution (the layers' per-state floor and first
moved layer, the path split's ``path``, importance sampling's ``ess``; full vocabulary none),
and a contribution installed from the test tree is called by ``attribution.analysis`` for the
baseline's floor, every comparison and every case, with no change to the hub.

Reads the runs sealed by the wave-4 release (``tests/data/wave4/runs``, read only): their sealed
attribution documents are what the contributions must reproduce; the ESS is recomputed here in
float64 from the sealed scores.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from log_ratio_peak import DIAGNOSTIC

from pytest_logprob_drift.attribution.analysis import Compared, SealedExecution, load_execution
from pytest_logprob_drift.attribution.document import (
    Attribution,
    document_json,
    read_attribution_bytes,
)
from pytest_logprob_drift.attribution.sealed import (
    attribution_dirs,
    differences,
    read_attribution,
    recompute,
)
from pytest_logprob_drift.diagnostics import registry
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.files import json_bytes

WAVE4 = Path(__file__).parent / "data" / "wave4" / "runs"
PROBE = "attribution_probe"


def _sealed(run: str) -> tuple[Path, Attribution, dict[str, Any]]:
    run_dir = WAVE4 / run
    (directory,) = attribution_dirs(run_dir)
    document = read_attribution(directory)
    return run_dir, document, document_json(document)


def _execution(run_dir: Path, case_id: str, attempt_id: str) -> SealedExecution:
    return load_execution(run_dir / layout.CASES / case_id / attempt_id)


def _contribution(name: str) -> Any:
    diagnostic = registry.by_name(name)
    assert diagnostic is not None, name
    return diagnostic.attribution()


def test_each_builtin_diagnostic_says_what_it_contributes() -> None:
    """Importance sampling, path split and layers contribute; full vocabulary does not."""
    assert _contribution("full_vocabulary") is None
    contributions = {n: _contribution(n) for n in ("importance_sampling", "path_split", "layers")}
    assert all(c is not None for c in contributions.values())
    assert len({type(c) for c in contributions.values()}) == 3


def test_the_layers_contribution_gives_the_sealed_first_moved_layer() -> None:
    """Its comparison members on the sealed deep-layers run equal the sealed ``layers``; its
    floor without repeats is none, and so is its ``noise_floor`` member."""
    run_dir, document, sealed = _sealed("wave4-hf-deep-layers")
    layers = _contribution("layers")
    baseline = _execution(run_dir, document.baseline.case_id, document.baseline.attempt_id)
    assert layers.noise_floor(baseline, []) is None
    assert layers.floor_members(None) == {}
    (case,) = sealed["cases"]
    assert case["layers"]["rollout"]["first_moved_layer"] is not None
    execution = _execution(run_dir, case["case_id"], case["attempt_id"])
    compared = _compared(execution, baseline)
    members = layers.comparison_members(compared, None)
    assert set(members) == {"layers"}
    assert differences(case["layers"], members["layers"]) == []
    assert layers.case_members(execution) == {}
    # against itself nothing moved: bitwise equal at every state, the drift enters nowhere new
    same = layers.comparison_members(_compared(baseline, baseline), None)["layers"]
    assert same["rollout"]["first_moved_layer"] is None
    assert same["drift_enters"] is None


def test_the_layer_floor_is_each_states_largest_repeat_excursion() -> None:
    """With the case standing in as a repeat, each state's floor is |its median - the
    baseline's| (computed here from the two sealed parts) and ``noise_floor.layers`` lists it."""
    run_dir, document, sealed = _sealed("wave4-hf-deep-layers")
    layers = _contribution("layers")
    baseline = _execution(run_dir, document.baseline.case_id, document.baseline.attempt_id)
    repeat = _execution(run_dir, sealed["cases"][0]["case_id"], sealed["cases"][0]["attempt_id"])
    assert baseline.diagnostics.layers is not None and repeat.diagnostics.layers is not None
    own = {s.state: s.median_rel_error for s in baseline.diagnostics.layers.figures.states}
    theirs = {s.state: s.median_rel_error for s in repeat.diagnostics.layers.figures.states}
    floor = layers.noise_floor(baseline, [repeat])
    assert floor == {state: abs(theirs[state] - own[state]) for state in own}
    assert layers.floor_members(floor) == {
        "layers": [{"state": s, "median_rel_error": v} for s, v in floor.items()]
    }
    # the case measured against its own excursion as floor: the drift enters nowhere
    members = layers.comparison_members(_compared(repeat, baseline), floor)
    assert members["layers"]["drift_enters"] is None
    # a repeat without layer figures of the same states: no floor is known
    smoke_dir, smoke, _ = _sealed("wave4-cpu-smoke")
    other = _execution(smoke_dir, smoke.baseline.case_id, smoke.baseline.attempt_id)
    assert other.diagnostics.layers is None
    assert layers.noise_floor(baseline, [repeat, other]) is None
    assert layers.noise_floor(other, [repeat]) is None


def test_the_path_contribution_gives_the_sealed_path_members() -> None:
    run_dir, document, sealed = _sealed("wave4-hf-bf16")
    path = _contribution("path_split")
    baseline = _execution(run_dir, document.baseline.case_id, document.baseline.attempt_id)
    assert path.noise_floor(baseline, []) is None
    for case in sealed["cases"]:
        execution = _execution(run_dir, case["case_id"], case["attempt_id"])
        members = path.comparison_members(_compared(execution, baseline), None)
        assert differences({"path": case["path"]}, members) == [], case["label"]
    # a run without a prefill replay has no path member
    run_dir, document, sealed = _sealed("wave4-cpu-smoke")
    baseline = _execution(run_dir, document.baseline.case_id, document.baseline.attempt_id)
    case = sealed["cases"][0]
    execution = _execution(run_dir, case["case_id"], case["attempt_id"])
    assert path.comparison_members(_compared(execution, baseline), None) == {}


def test_the_importance_contribution_gives_the_ess_recomputed_here() -> None:
    """``ess`` = (sum w)^2 / (n sum w^2), w = exp(training - rollout) over active tokens, in
    float64 from the sealed scores; equal to the sealed document's."""
    run_dir, _, sealed = _sealed("wave4-cpu-smoke")
    importance = _contribution("importance_sampling")
    for case in sealed["cases"]:
        execution = _execution(run_dir, case["case_id"], case["attempt_id"])
        training = execution.training_logprobs.to(torch.float64).tolist()
        rollout = execution.rollout["logprobs"].to(torch.float64).tolist()
        active = execution.rollout["active_mask"].tolist()
        weights = [
            math.exp(t - r)
            for trow, rrow, arow in zip(training, rollout, active, strict=True)
            for t, r, on in zip(trow, rrow, arow, strict=True)
            if on
        ]
        by_hand = sum(weights) ** 2 / (len(weights) * sum(w * w for w in weights))
        (member,) = importance.case_members(execution).items()
        assert member[0] == "ess"
        assert member[1] == pytest.approx(by_hand, rel=1e-9)
        assert member[1] == pytest.approx(case["ess"], rel=1e-9)


def test_the_importance_contribution_leaves_the_ess_out_of_a_document_sealed_before_it() -> None:
    """A pre-issue-20 document records no ESS: the recomputation is compared without it."""
    run_dir = Path(__file__).parent / "data" / "pre_issue20" / "runs" / "fixture-pre20-cpu-smoke"
    (directory,) = attribution_dirs(run_dir)
    recorded = read_attribution(directory)
    recomputed = read_attribution_bytes(json_bytes(recompute(run_dir, recorded)))
    assert all("ess" in case for case in document_json(recomputed)["cases"])
    importance = _contribution("importance_sampling")
    shaped = document_json(importance.as_recorded(recorded, recomputed))
    assert not any("ess" in case for case in shaped["cases"])
    # a document that records it keeps it
    _, wave4, _ = _sealed("wave4-cpu-smoke")
    assert importance.as_recorded(wave4, wave4) is wave4


# ---- a contribution from the test tree ------------------------------------------------------


class _Probe:
    """A contribution recording what the attribution hub hands it, adding one member to each
    part of the document (plain JSON data: ``attribute``'s output before it is sealed)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.clash: str | None = None
        """A member of the comparison the probe also returns (a contribution's slip)."""

    def noise_floor(self, baseline: SealedExecution, repeats: Any) -> object | None:
        self.calls.append(("floor", baseline.case_id, len(repeats)))
        return "its own floor"

    def floor_members(self, floor: object | None) -> dict[str, Any]:
        return {PROBE: floor}

    def comparison_members(self, compared: Compared, floor: object | None) -> dict[str, Any]:
        self.calls.append(("compared", compared.case.case_id, compared.reference.case_id, floor))
        clash = {} if self.clash is None else {self.clash: "also mine"}
        return {PROBE: compared.rollout.max_abs_delta, **clash}

    def case_members(self, case: SealedExecution) -> dict[str, Any]:
        return {f"{PROBE}_case": case.label}

    def as_recorded(self, recorded: Attribution, recomputed: Attribution) -> Attribution:
        return recomputed


class _Contributing:
    """The test tree's diagnostic under another name, contributing ``_Probe``."""

    name = PROBE
    config_key = None  # the test tree's config key stays the test diagnostic's own

    def __init__(self, probe: _Probe) -> None:
        self.probe = probe

    def __getattr__(self, member: str) -> Any:
        return getattr(DIAGNOSTIC, member)

    def attribution(self) -> _Probe:
        return self.probe


@pytest.fixture
def probe() -> Iterator[_Probe]:
    probe = _Probe()
    registry.install(_Contributing(probe))  # type: ignore[arg-type]
    try:
        yield probe
    finally:
        registry.uninstall(PROBE)


def test_an_installed_contribution_is_called_by_the_attribution_with_no_hub_change(
    probe: _Probe,
) -> None:
    run_dir, document, sealed = _sealed("wave4-hf-bf16")
    recomputed = recompute(run_dir, document)
    baseline = document.baseline.case_id
    assert recomputed["noise_floor"][PROBE] == "its own floor"
    assert probe.calls[0] == ("floor", baseline, 0)
    assert [c for c in probe.calls if c[0] == "floor"] == [probe.calls[0]]  # once per run
    compared = [c for c in probe.calls if c[0] == "compared"]
    assert compared == [
        ("compared", c["case_id"], baseline, "its own floor") for c in sealed["cases"]
    ]
    for case, entry in zip(sealed["cases"], recomputed["cases"], strict=True):
        assert entry[PROBE] == case["rollout"]["max_abs_delta"]  # its comparison member
        assert entry[PROBE] == entry["rollout"]["max_abs_delta"]
        # the built-in members are still there, as sealed
        assert differences(case["path"], entry["path"]) == []
        assert differences(case["ess"], entry["ess"]) == []
        assert entry[f"{PROBE}_case"] == case["label"]  # its case member


def _compared(case: SealedExecution, reference: SealedExecution) -> Compared:
    """The comparison the hub hands a contribution (``attribution.analysis``'s own sides)."""
    from pytest_logprob_drift.attribution.analysis import SideFloor, _sides

    alignment, rollout, training = _sides(case, reference)
    return Compared(
        case=case,
        reference=reference,
        alignment=alignment,
        rollout=rollout,
        training=training,
        floor=SideFloor(rollout=0.0, training=0.0, measured=False),
    )


@pytest.mark.parametrize("member", ["classification", "layers"])
def test_a_contribution_taking_a_member_the_document_has_is_refused_by_name(
    probe: _Probe, member: str
) -> None:
    """A core member, or one a built-in diagnostic contributed, is never overwritten."""
    run_dir, document, _ = _sealed("wave4-hf-deep-layers")
    probe.clash = member
    with pytest.raises(ValueError, match=f"member '{member}' of a comparison is taken"):
        recompute(run_dir, document)
