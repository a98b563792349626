"""NeMo-RL's refusals when a step's values are checked together (issue 58): a negative token
id, a mask value that is not 0/1 and a ``token_loss_mask`` 1 beyond ``input_lengths`` are found
by one pass over the step's values, yet each is refused at its own line, worded as a line read
alone words it, and the first bad line of the file is the one refused, whichever check finds
it. An import leaves torch's thread count as it found it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from drift_testing import cli
from production_dumps import make_samples, nemo_rl_log_data


def _lines(count: int = 4) -> list[dict[str, Any]]:
    data = nemo_rl_log_data(make_samples(np.random.default_rng(58), count))
    return [{**{k: v[i : i + 1] for k, v in data.items()}, "idx": i} for i in range(count)]


def _refused(tmp_path: Path, lines: list[dict[str, Any]]) -> tuple[Path, str]:
    path = tmp_path / "train_data_step3.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    artifacts = tmp_path / "runs"
    code, out, err = cli("import", "--format", "nemo-rl", path, "--artifacts", artifacts)
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert not artifacts.exists() or os.listdir(artifacts) == [], "nothing may be published"
    return path, err


def _negative_id(line: dict[str, Any]) -> str:
    line["token_ids"][0][2] = -5
    return "token_ids: negative token id -5"


def _half_mask(line: dict[str, Any]) -> str:
    line["token_loss_mask"][0][7] = 0.5
    return "token_loss_mask holds 0.5 at position 7: a mask is 0 or 1"


def _beyond(line: dict[str, Any]) -> str:
    length, position = line["input_lengths"][0], len(line["token_ids"][0])
    line["token_ids"][0].append(11)
    for name in ("generation_logprobs", "prev_logprobs"):
        line[name][0].append(-0.5)
    line["token_loss_mask"][0].append(1)
    return f"token_loss_mask is 1 at position {position}, beyond input_lengths {length}"


@pytest.mark.parametrize("fault", [_negative_id, _half_mask, _beyond])
@pytest.mark.parametrize("at", [0, 3])
def test_a_value_refused_at_its_own_line(tmp_path: Path, fault: Any, at: int) -> None:
    lines = _lines()
    message = fault(lines[at])
    path, err = _refused(tmp_path, lines)
    assert f"{path}:{at + 1}: {message}" in err, err


def test_the_first_bad_line_is_refused_whichever_check_finds_it(tmp_path: Path) -> None:
    lines = _lines()
    message = _half_mask(lines[1])
    del lines[2]["prev_logprobs"]  # found as line 3 is read, before line 2's values are checked
    path, err = _refused(tmp_path, lines)
    assert f"{path}:2: {message}" in err, err

    lines = _lines()
    del lines[1]["prev_logprobs"]
    _negative_id(lines[2])
    path, err = _refused(tmp_path, lines)
    assert f"{path}:2: missing NeMo-RL field(s) prev_logprobs" in err, err

    lines = _lines()
    _beyond(lines[2])
    _negative_id(lines[1])
    path, err = _refused(tmp_path, lines)
    assert f"{path}:2: token_ids: negative token id -5" in err, err

    lines = _lines()
    _half_mask(lines[1])
    lines[3] = {"not": "nemo"}  # not a row of the format at all
    path, err = _refused(tmp_path, lines)
    assert f"{path}:2: token_loss_mask holds 0.5" in err, err


def test_an_import_leaves_the_thread_count_as_it_found_it(tmp_path: Path) -> None:
    before = torch.get_num_threads()
    wanted = 2 if before != 2 else 3
    torch.set_num_threads(wanted)
    try:
        lines = _lines()
        path = tmp_path / "logs" / "train_data_step1.jsonl"
        path.parent.mkdir()
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        code, _, err = cli("import", "--format", "nemo-rl", path, "--artifacts", tmp_path / "a")
        assert code in (0, 1), err
        assert torch.get_num_threads() == wanted
        _negative_id(lines[0])
        _, err = _refused(tmp_path, lines)
        assert "negative token id" in err
        assert torch.get_num_threads() == wanted
    finally:
        torch.set_num_threads(before)
