"""Replay's engine-free parts (issue 22): which pairs compare like with like, the path
classification, the diagnostic statuses and their strict reading, the text the CLI and the
plugin show, and the canonical replay grid's refusals. Every expectation is derived here."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import S0, cli, run_s0

from pytest_logprob_drift.attribution.text import PATH_HEADERS, path_rows
from pytest_logprob_drift.diagnostics.path_split import views as path_split_text
from pytest_logprob_drift.diagnostics.path_split.attribution import (
    PATH_BOTH,
    PATH_DECODE_ONLY,
    PATH_NO_EFFECT,
    PATH_PREFILL_ONLY,
    PATH_TRAINING,
    classify_path,
)
from pytest_logprob_drift.numerics.comparison import Diagnostics, PathSplit, from_builtins
from pytest_logprob_drift.numerics.path_split import (
    PAIRS,
    comparable_pairs,
    path_split,
    processing_is_identity,
)
from pytest_logprob_drift.numerics.sampling import Truncation
from pytest_logprob_drift.runtimes.batch import replay_grid, sequences
from pytest_logprob_drift.store.decode import JSONDocumentError, decode
from pytest_logprob_drift.store.files import json_bytes
from tests import attribution_records as records

pytest_plugins = ["pytester"]

KINDS = ("raw", "processed")


@pytest.mark.parametrize(
    ("how", "identity"),
    [
        (Truncation(temperature=1.0), True),
        (Truncation(temperature=0.0), True),  # greedy: nothing is processed
        (Truncation(temperature=0.0, top_k=5), True),
        (Truncation(temperature=0.7), False),
        (Truncation(temperature=1.0, top_k=5), False),
        (Truncation(temperature=1.0, top_p=0.9), False),
        (Truncation(temperature=1.0, top_p=1.0), True),
        (Truncation(temperature=1.0, min_p=0.1), False),
    ],
)
def test_processing_is_the_identity_only_when_it_changes_no_logit(
    how: Truncation, identity: bool
) -> None:
    assert processing_is_identity(how) is identity
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    from pytest_logprob_drift.numerics.sampling import processed_logits

    same = torch.equal(
        torch.log_softmax(processed_logits(logits, how), -1), torch.log_softmax(logits, -1)
    )
    assert same is identity


@pytest.mark.parametrize(
    ("decode", "prefill", "training"), list(itertools.product(KINDS, repeat=3))
)
@pytest.mark.parametrize("identity", [True, False])
def test_a_pair_is_comparable_when_both_sides_are_the_same_kind(
    decode: str, prefill: str, training: str, identity: bool
) -> None:
    got = comparable_pairs(
        decode=decode, prefill=prefill, training=training, identity_processing=identity
    )
    kinds = {"decode": decode, "prefill": prefill, "training": training}
    for pair in PAIRS:
        left, right = pair.split("_")
        assert got[pair] is (identity or kinds[left] == kinds[right]), pair


def test_an_unknown_semantics_is_refused() -> None:
    with pytest.raises(ValueError, match="prefill semantics"):
        comparable_pairs(decode="raw", prefill="log", training="raw", identity_processing=True)


@pytest.mark.parametrize(("d", "p", "t"), list(itertools.product((False, True), repeat=3)))
def test_path_classification_names_each_moved_path(d: bool, p: bool, t: bool) -> None:
    got = classify_path(decode_moved=d, prefill_moved=p, training_moved=t)
    parts = got.split("; ")
    assert (PATH_BOTH in parts) is (d and p)
    assert (PATH_DECODE_ONLY in parts) is (d and not p)
    assert (PATH_PREFILL_ONLY in parts) is (p and not d)
    assert (PATH_TRAINING in parts) is t
    assert (got == PATH_NO_EFFECT) is not (d or p or t)


def _document(prefill: dict[str, Any], comparable: dict[str, bool], figures: Any) -> dict[str, Any]:
    return {
        "path_split": {
            "prefill": prefill,
            "decode_replay": {"status": "replay_unavailable", "reason": "no V2 runner"},
            "comparable": comparable,
            "figures": figures,
        }
    }


def _figures(comparable: dict[str, bool]) -> dict[str, Any]:
    g = torch.Generator().manual_seed(7)
    decode = -torch.rand(2, 6, generator=g) * 4
    prefill = decode.clone()
    prefill[0, 4] -= 0.25
    training = decode - 0.5
    active = torch.zeros(2, 6, dtype=torch.bool)
    active[:, 2:] = True
    return path_split(
        decode=decode, prefill=prefill, training=training, active=active, comparable=comparable
    )


ALL = dict.fromkeys(PAIRS, True)


def test_text_shows_the_split_its_statuses_and_properties() -> None:
    figures = _figures(ALL)
    ran = {"status": "replay_ran", "evidence": {"num_cached_tokens": 0}}
    diagnostics = from_builtins(_document(ran, ALL, figures), Diagnostics)
    cells = path_split_text.cells(diagnostics)
    assert cells == [f"{0.25:.3g}", f"{figures['prefill_training']['max']:.3g}"]
    (split, status) = path_split_text.lines(diagnostics)
    assert split.startswith("path split: decode-prefill max 0.25")
    assert f"bitwise on {figures['bitwise_equal_fraction']:.0%}" in split
    assert status == "decode replay: replay_unavailable (no V2 runner)"
    props = dict(path_split_text.properties(diagnostics))
    assert props["drift_path_prefill_status"] == "replay_ran"
    assert props["drift_path_decode_replay_reason"] == "no V2 runner"
    assert float(props["drift_path_decode_prefill_max"]) == 0.25
    assert float(props["drift_path_bitwise_equal_fraction"]) == figures["bitwise_equal_fraction"]
    assert path_split_text.has_path_split([None, diagnostics])
    assert not path_split_text.has_path_split([None, Diagnostics()])
    assert path_split_text.cells(Diagnostics()) == ["-", "-"]
    assert path_split_text.lines(None) == [] and path_split_text.properties(None) == []


def test_text_of_an_incomparable_and_of_an_unavailable_prefill() -> None:
    comparable = {**ALL, "decode_prefill": False, "decode_training": True}
    incomparable = {
        "status": "replay_incomparable",
        "evidence": {"logprob_semantics": "raw"},
        "reason": "raw against processed",
    }
    diagnostics = from_builtins(
        _document(incomparable, comparable, _figures(comparable)), Diagnostics
    )
    assert path_split_text.cells(diagnostics)[0] == "incomparable"
    assert "decode-prefill incomparable" in path_split_text.lines(diagnostics)[0]
    assert "prefill replay: replay_incomparable (raw against processed)" in (
        path_split_text.lines(diagnostics)
    )
    none = {**ALL, "decode_prefill": False, "prefill_training": False}
    unavailable = {"status": "replay_unavailable", "reason": "no prefill replay"}
    diagnostics = from_builtins(_document(unavailable, none, None), Diagnostics)
    assert path_split_text.cells(diagnostics) == ["n/a", "n/a"]
    assert dict(path_split_text.properties(diagnostics))["drift_path_decode_prefill_max"] == "-"


@pytest.mark.parametrize(
    ("status", "path"),
    [
        (
            {"status": "replay_incomparable", "evidence": {}},
            "$.prefill: replay_incomparable has no reason",
        ),
        ({"status": "replay_ran", "reason": "x"}, "$.prefill: replay_ran has no evidence"),
        (
            {"status": "replay_ran", "evidence": {}, "reason": "x"},
            "$.prefill: replay_ran takes no reason",
        ),
        ({"status": "unobservable", "reason": "x"}, "$.prefill.status: Invalid enum value "),
        ({"status": "unsupported", "reason": "x"}, "$.prefill.status: Invalid enum value "),
        (
            {"status": "replay_ran", "evidence": []},
            "$.prefill.evidence: Expected `object`, got `array`",
        ),
    ],
)
def test_replay_statuses_are_their_own_and_read_strictly(status: dict[str, Any], path: str) -> None:
    with pytest.raises(JSONDocumentError) as caught:
        decode(json_bytes(_document(status, ALL, None)["path_split"]), PathSplit)
    assert str(caught.value).startswith(path)


def test_replay_grid_places_the_logprobs_and_refuses_a_short_sequence() -> None:
    batch = {
        "token_ids": torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]]),
        "attention_mask": torch.tensor([[True, True, True, False], [True, True, False, False]]),
        "active_mask": torch.tensor([[False, True, True, False], [False, True, False, False]]),
    }
    assert sequences(batch) == [[5, 6, 7], [8, 9]]
    values, ids = replay_grid(batch, [[None, -1.0, -2.0], [None, -3.0]], [[5, 6, 7], [8, 9]], 0)
    assert values.tolist() == [[0.0, -1.0, -2.0, 0.0], [0.0, -3.0, 0.0, 0.0]]
    assert torch.equal(ids, batch["token_ids"])
    with pytest.raises(ValueError, match="replay scored 2 tokens of row 0, which has 3"):
        replay_grid(batch, [[None, -1.0], [None, -3.0]], [[5, 6], [8, 9]], 0)
    with pytest.raises(ValueError, match="no logprob for row 1, position 1"):
        replay_grid(batch, [[None, -1.0, -2.0], [None, None]], [[5, 6, 7], [8, 9]], 0)
    with pytest.raises(ValueError, match="1 sequences for 2 rows"):
        replay_grid(batch, [[None, -1.0, -2.0]], [[5, 6, 7]], 0)


def test_path_rows_list_only_cases_with_a_path_in_ranking_order() -> None:
    moved, still = records.movement(0.5), records.movement(0.0)
    document = records.attribution(
        [
            records.case_data(
                "a",
                rollout=moved,
                training=still,
                path={"classification": PATH_DECODE_ONLY, "prefill": still},
            ),
            records.case_data(
                "b",
                rollout=moved,
                training=moved,
                path={"classification": PATH_BOTH, "prefill": moved},
            ),
            records.case_data("c"),
        ],
        ["b", "a", "c"],
    )
    rows = path_rows(document.ranked())
    assert [r[0] for r in rows] == ["b", "a"]
    assert rows[1] == ["a", PATH_DECODE_ONLY, "0.5", "0", "0"]
    assert len(PATH_HEADERS) == len(rows[0])


# ------------------------------------------------- the run-wide flag, on the smoke runtime


def test_run_replay_flag_records_an_engine_without_replay_as_unavailable(tmp_path: Path) -> None:
    """``run --replay`` turns replay on for every case; the smoke rollout has no replay, so
    each case records ``replay_unavailable`` with the reason, seals no replay file, verifies,
    and keeps the verdicts, mismatch counts and case ids of the run without it."""
    code_on, out_on, err_on = run_s0(tmp_path / "on", "--replay")
    code_off, out_off, _ = run_s0(tmp_path / "off")
    assert code_on == code_off == 0, err_on[-2000:]
    on, off = json.loads(out_on)["results"], json.loads(out_off)["results"]
    key = ("case_id", "label", "outcome", "mismatches", "active_tokens")
    assert [[r[k] for k in key] for r in on] == [[r[k] for k in key] for r in off]
    run_dir = next((tmp_path / "on").iterdir())
    attempts = list(run_dir.glob("cases/*/*/comparison.json"))
    assert len(attempts) == len(on)
    for path in attempts:
        split = json.loads(path.read_text())["diagnostics"]["path_split"]
        for replay, method in (("prefill", "replay_prefill"), ("decode_replay", "replay_decode")):
            assert split[replay]["status"] == "replay_unavailable"
            assert split[replay]["reason"].endswith(f"has no {method}")
        assert split["figures"] is None
        assert not (path.parent / "score_rollout_prefill.pt").exists()
    for path in (tmp_path / "off").glob("*/cases/*/*/comparison.json"):
        assert "path_split" not in json.loads(path.read_text())["diagnostics"]
    assert cli("verify", run_dir)[0] == 0


def test_plugin_replay_flag_puts_the_status_in_the_failure_text_and_junit(
    pytester: pytest.Pytester,
) -> None:
    """``--drift-replay`` on the smoke runtime (no replay there): the failing offset case's
    failure text names the replay's status and reason; every item's junit properties carry
    ``drift_path_*``."""
    shutil.copy(S0, pytester.path / "s0.json")
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest(
        "--drift-config",
        "s0.json",
        "--drift-runtime",
        "cpu-smoke",
        "--drift-allow-smoke-operators",
        "--drift-replay",
        "--junitxml",
        str(junit),
        "-p",
        "no:cacheprovider",
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*prefill replay: replay_unavailable (the rollout engine*"])
    text = junit.read_text()
    assert text.count('name="drift_path_prefill_status" value="replay_unavailable"') >= 2
    assert 'name="drift_path_decode_replay_reason"' in text
