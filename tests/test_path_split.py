"""The path split's figures (numerics.path_split), its comparison.json part (strict reader,
byte-for-byte round trip, absent in old comparisons) and the opt-in ``diagnostics.replay``
config key (never part of a case id)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from drift_testing import S0, experiment_config

from pytest_logprob_drift import ConfigError, plan_file
from pytest_logprob_drift.numerics.comparison import Diagnostics, PathSplit, from_builtins
from pytest_logprob_drift.numerics.path_split import differences, path_split
from pytest_logprob_drift.store.decode import JSONDocumentError
from pytest_logprob_drift.store.decode import decode as decode_json
from pytest_logprob_drift.store.files import json_bytes


def _grid(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    decode = -torch.rand(4, 9, generator=g, dtype=torch.float32) * 8
    prefill = decode.clone()
    prefill[1, 5:] += 1e-3 * torch.rand(4, generator=g)
    training = decode + 1e-2 * torch.randn(4, 9, generator=g)
    active = torch.zeros(4, 9, dtype=torch.bool)
    active[:, 3:] = True
    active[2, 7:] = False
    return decode, prefill, training.float(), active


def test_identity_holds_exactly_per_token_in_float64() -> None:
    decode, prefill, training, _ = _grid(0)
    d = differences(decode, prefill, training)
    assert torch.equal(d["decode_training"], d["decode_prefill"] + d["prefill_training"])
    assert d["decode_training"].dtype is torch.float64


def test_figures_against_an_independent_recompute() -> None:
    decode, prefill, training, active = _grid(1)
    figures = path_split(
        decode=decode,
        prefill=prefill,
        training=training,
        active=active,
        comparable={"decode_prefill": True, "prefill_training": True, "decode_training": True},
    )
    assert figures["active_tokens"] == int(active.sum())
    for pair, (a, b) in {
        "decode_prefill": (decode, prefill),
        "prefill_training": (prefill, training),
        "decode_training": (decode, training),
    }.items():
        values = [
            abs(float(a[i, j]) - float(b[i, j]))
            for i in range(a.shape[0])
            for j in range(a.shape[1])
            if active[i, j]
        ]
        assert figures[pair]["max"] == max(values)
        assert figures[pair]["mean"] == pytest.approx(sum(values) / len(values), rel=1e-12)
    equal = [
        float(decode[i, j]) == float(prefill[i, j])
        for i in range(4)
        for j in range(9)
        if active[i, j]
    ]
    assert figures["bitwise_equal_fraction"] == pytest.approx(sum(equal) / len(equal))
    firsts = []
    for i in range(4):
        row = [j for j in range(9) if active[i, j]]
        diff = [k for k, j in enumerate(row) if float(decode[i, j]) != float(prefill[i, j])]
        firsts.append(diff[0] if diff else None)
    assert figures["first_difference"] == firsts


def test_incomparable_pairs_get_no_figures() -> None:
    decode, prefill, training, active = _grid(2)
    figures = path_split(
        decode=decode,
        prefill=prefill,
        training=training,
        active=active,
        comparable={"decode_prefill": False, "prefill_training": True, "decode_training": True},
    )
    assert figures["decode_prefill"] is None
    assert figures["bitwise_equal_fraction"] is None and figures["first_difference"] is None
    assert figures["prefill_training"] is not None


def _part(figures: object) -> dict[str, object]:
    return {
        "prefill": {"status": "replay_ran", "evidence": {"num_cached_tokens": 0}},
        "decode_replay": {"status": "replay_unavailable", "reason": "engine refuses it"},
        "comparable": {"decode_prefill": True, "prefill_training": True, "decode_training": True},
        "figures": figures,
    }


def test_path_split_part_round_trips_byte_for_byte() -> None:
    decode, prefill, training, active = _grid(3)
    figures = path_split(
        decode=decode,
        prefill=prefill,
        training=training,
        active=active,
        comparable={"decode_prefill": True, "prefill_training": True, "decode_training": True},
        decode_replay=decode,
    )
    document = {"path_split": _part(figures)}
    parsed = from_builtins(document, Diagnostics)
    assert parsed.path_split is not None
    assert json.dumps(parsed.to_json(), sort_keys=True) == json.dumps(document, sort_keys=True)
    assert Diagnostics().path_split is None


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda d: d.pop("comparable"), "$: Object missing required field `comparable`"),
        (lambda d: d.update(extra=1), "$: Object contains unknown field `extra`"),
        (
            lambda d: d["prefill"].update(status="unsupported", reason="x"),
            "$.prefill.status: Invalid enum value 'unsupported'",
        ),
        (
            lambda d: d["comparable"].update(decode_prefill="yes"),
            "$.comparable[...]: Expected `bool`, got `str`",
        ),
        (
            lambda d: d["comparable"].pop("decode_prefill"),
            "$.comparable: Object missing required field `decode_prefill`",
        ),
    ],
)
def test_path_split_part_is_read_strictly(mutate: object, path: str) -> None:
    document = _part(None)
    mutate(document)  # type: ignore[operator]
    with pytest.raises(JSONDocumentError) as caught:
        decode_json(json_bytes(document), PathSplit)
    assert str(caught.value) == path


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_replay_must_be_a_boolean(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ConfigError) as caught:
        plan_file(_config(tmp_path, {"replay": bad}))
    assert "$.diagnostics.replay" in str(caught.value)


def _config(work: Path, diagnostics: object | None, name: str = "config.json") -> str:
    changes = {} if diagnostics is None else {"diagnostics": diagnostics}
    return str(experiment_config(work, S0, changes, file_name=name))


def test_replay_is_opt_in_and_not_in_case_ids(tmp_path: Path) -> None:
    without = plan_file(_config(tmp_path, None, "a.json"))
    with_ = plan_file(_config(tmp_path, {"replay": True}, "b.json"))
    both = plan_file(_config(tmp_path, {"replay": True, "full_vocabulary": True}, "c.json"))
    off = plan_file(_config(tmp_path, {"replay": False}, "d.json"))
    ids = [c.case.case_id for c in without.cases]
    assert ids == [c.case.case_id for c in with_.cases] == [c.case.case_id for c in both.cases]
    assert with_.plan.replay and both.plan.replay and both.plan.full_vocabulary is not None
    assert not without.plan.replay and not off.plan.replay
