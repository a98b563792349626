"""The recipes of docs/PRODUCTION_RUNS.md run as written (issue 48, point 7).

The row-writing code blocks of the verl V1 and TRL recipes are taken from the page (the block
after its ``<!-- drift-rows: ... -->`` marker) and run on batches laid out as those frameworks
lay them out, copied from their sources:

- verl v0.9.0 (verl-project/verl tag v0.9.0): the V1 trainer's TransferQueue fields are one
  unpadded tensor per sample (``AgentLoopOutput.as_dict`` in
  ``verl/experimental/agent_loop/agent_loop.py``: ``prompts``, ``responses``,
  ``response_mask`` int64, ``rollout_log_probs`` float32), and ``_compute_old_log_prob``
  (``verl/trainer/ppo/v1/trainer_base.py``) writes ``old_log_probs`` =
  ``response_from_nested(log_probs, response_mask)`` (``verl/workers/utils/padding.py``,
  copied below: the model output over prompt and response, left-shifted by one).
- TRL (huggingface/trl at f2cd577, ``trl/trainer/grpo_trainer.py``): after a tool call the
  completion is the model's tokens, the tool result and the post-tool tokens; ``tool_mask``
  gets ``[0] * tool_length + [1] * post_tool_length`` and the sampling logprobs
  ``[0.0] * tool_length + post_tool_logprobs`` (``_tool_call_loop``), then
  ``_generate_and_score_completions`` pads: prompts left (mask 0), completions right
  (``completion_mask`` 0, sampling logprobs 0.0, ``tool_mask`` 1), and the loss mask is
  ``completion_mask * tool_mask``.

Every imported step is checked against numpy float64 over the framework's own loss mask: the
TRL recipe gives PASS where a mask without ``tool_mask`` would count every tool token as a
mismatch.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from drift_testing import cli
from production_dumps import THRESHOLD

DOC = Path(__file__).resolve().parents[1] / "docs" / "PRODUCTION_RUNS.md"


def _recipe(name: str) -> dict[str, Any]:
    """The namespace of the code block after ``<!-- drift-rows: name -->``."""
    text = DOC.read_text()
    match = re.search(rf"<!-- drift-rows: {name} -->\n```python\n(.*?)```", text, re.S)
    assert match, f"no drift-rows block {name!r} in {DOC}"
    namespace: dict[str, Any] = {}
    exec(compile(match.group(1), f"{DOC}:{name}", "exec"), namespace)
    return namespace


def _import(path: Path, artifacts: Path) -> tuple[int, dict[str, Any], str]:
    code, out, err = cli(
        "import", "--format", "jsonl", path, "--artifacts", artifacts, "--json"
    )  # fmt: skip
    return code, (json.loads(out) if out.strip() else {}), err


def _numpy_verdict(
    training: list[np.ndarray], rollout: list[np.ndarray], masks: list[np.ndarray]
) -> dict[str, Any]:
    t = np.concatenate([x.astype(np.float64)[m == 1] for x, m in zip(training, masks, strict=True)])
    r = np.concatenate([x.astype(np.float64)[m == 1] for x, m in zip(rollout, masks, strict=True)])
    diff = np.abs(t - r)
    mismatches = int((diff > THRESHOLD).sum())
    return {
        "outcome": "MISMATCH" if mismatches else "PASS",
        "active_tokens": int(diff.size),
        "mismatches": mismatches,
        "max_abs_diff": float(diff.max()),
    }


# --------------------------------------------------------------------------- verl V1


def response_from_nested(tensor: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """verl v0.9.0 ``verl/workers/utils/padding.py`` ``response_from_nested``."""
    values, offsets = tensor.values(), tensor.offsets()
    response_lens = response_mask.offsets().diff()
    response_list = []
    for resp_len, seq_offset in zip(response_lens, offsets[1:], strict=True):
        # left-shift model output by one token for log_probs/values
        response_list.append(values[seq_offset - resp_len - 1 : seq_offset - 1])
    return torch.nested.as_nested_tensor(response_list, layout=torch.jagged)


def _jagged(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def test_verl_v1_recipe_writes_what_verl_trains_on(tmp_path: Path) -> None:
    rng = np.random.default_rng(4807)
    prompts, responses, masks, rollout, model_out, training = [], [], [], [], [], []
    for i in range(6):
        p, n = int(rng.integers(3, 9)), int(rng.integers(4, 15))
        prompts.append(torch.tensor(rng.integers(1, 30000, p), dtype=torch.int64))
        responses.append(torch.tensor(rng.integers(1, 30000, n), dtype=torch.int64))
        mask = np.ones(n, dtype=np.int64)
        mask[-1] = 0  # as a multi-turn agent loop masks a turn's tail
        masks.append(torch.tensor(mask))
        r = (-rng.exponential(1.0, n)).astype(np.float32)
        t = (r + rng.uniform(-2e-4, 2e-4, n)).astype(np.float32)
        if i == 2:
            t[1] = np.float32(r[1] - 0.3)
        rollout.append(torch.tensor(r))
        training.append(t)
        # the model's output over prompt + response: position j holds the logprob of token
        # j + 1, so the response's logprobs are the p - 1 .. p + n - 2 ones
        full = rng.normal(size=p + n).astype(np.float32)
        full[p - 1 : p + n - 1] = t
        model_out.append(torch.tensor(full))
    response_mask = _jagged(masks)
    data = {
        "prompts": _jagged(prompts),
        "responses": _jagged(responses),
        "response_mask": response_mask,
        "rollout_log_probs": _jagged(rollout),
        "old_log_probs": response_from_nested(_jagged(model_out), response_mask),
    }
    recipe = _recipe("verl-v1")
    assert recipe["DRIFT_FIELDS"] == list(data)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)  # the recipe writes drift/step<N>.jsonl where the trainer runs
        recipe["write_drift_rows"](data, 7)
    code, result, err = _import(tmp_path / "drift" / "step7.jsonl", tmp_path / "runs")
    assert code == 1, err
    (step,) = result["results"]
    want = _numpy_verdict(training, [x.numpy() for x in rollout], [m.numpy() for m in masks])
    assert {k: step[k] for k in want} == want
    assert step["step"] == 7 and step["samples"] == 6 and want["mismatches"] == 1


# --------------------------------------------------------------------------- TRL


def pad(tensors: list[torch.Tensor], padding_value: float, padding_side: str) -> torch.Tensor:
    """``trl.trainer.utils.pad`` (without ``pad_to_multiple_of``)."""
    width = max(t.numel() for t in tensors)
    out = torch.full((len(tensors), width), padding_value, dtype=tensors[0].dtype)
    for i, t in enumerate(tensors):
        if padding_side == "left":
            out[i, width - t.numel() :] = t
        else:
            out[i, : t.numel()] = t
    return out


@pytest.fixture(scope="module")
def trl_output() -> dict[str, Any]:
    """One ``_generate_and_score_completions`` output with tool calls in two of four
    completions, and the trainer's recomputation (which scores the tool tokens too)."""
    rng = np.random.default_rng(4808)
    prompt_ids, completion_ids, tool_masks, sampling, old = [], [], [], [], []
    for i in range(4):
        prompt_ids.append(torch.tensor(rng.integers(1, 30000, int(rng.integers(3, 8)))))
        n = int(rng.integers(4, 9))
        ids = rng.integers(1, 30000, n).tolist()
        logprobs = (-rng.exponential(1.0, n)).astype(np.float32).tolist()
        tool_mask = [1] * n
        if i in (1, 3):  # _tool_call_loop: the tool result, then the post-tool completion
            tool_length, post = int(rng.integers(5, 11)), int(rng.integers(3, 7))
            ids += rng.integers(1, 30000, tool_length + post).tolist()
            post_logprobs = (-rng.exponential(1.0, post)).astype(np.float32).tolist()
            tool_mask += [0] * tool_length + [1] * post
            logprobs += [0.0] * tool_length + post_logprobs
        # the trainer scores every completion token; on the tool result it has real logprobs
        recomputed = np.asarray(logprobs, dtype=np.float32)
        recomputed = recomputed + rng.uniform(-3e-4, 3e-4, len(ids)).astype(np.float32)
        tool = np.asarray(tool_mask) == 0
        recomputed[tool] = (-rng.uniform(2.0, 11.0, int(tool.sum()))).astype(np.float32)
        completion_ids.append(torch.tensor(ids))
        tool_masks.append(torch.tensor(tool_mask))
        sampling.append(torch.tensor(logprobs, dtype=torch.float32))
        old.append(torch.tensor(recomputed, dtype=torch.float32))
    prompt_mask = [torch.ones_like(p) for p in prompt_ids]
    completion_mask = [torch.ones_like(c) for c in completion_ids]
    return {
        "prompt_ids": pad(prompt_ids, 0, "left"),
        "prompt_mask": pad(prompt_mask, 0, "left"),
        "completion_ids": pad(completion_ids, 0, "right"),
        "completion_mask": pad(completion_mask, 0, "right"),
        "sampling_per_token_logps": pad(sampling, 0.0, "right"),
        "old_per_token_logps": pad(old, 0.0, "right"),
        "tool_mask": pad(tool_masks, 1, "right"),
    }


def _write_trl(path: Path, out: dict[str, Any]) -> Path:
    rows = _recipe("trl")["drift_rows"](out, 3, 0)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _trl_numpy(out: dict[str, Any], mask: torch.Tensor) -> dict[str, Any]:
    return _numpy_verdict(
        [x.numpy() for x in out["old_per_token_logps"]],
        [x.numpy() for x in out["sampling_per_token_logps"]],
        [m.numpy() for m in mask],
    )


def test_trl_recipe_with_tool_calls_masks_them_as_trl_does(
    trl_output: dict[str, Any], tmp_path: Path
) -> None:
    code, result, err = _import(_write_trl(tmp_path / "drift.jsonl", trl_output), tmp_path / "runs")
    assert code == 0, err
    (step,) = result["results"]
    loss_mask = trl_output["completion_mask"] * trl_output["tool_mask"]
    want = _trl_numpy(trl_output, loss_mask)
    assert {k: step[k] for k in want} == want
    assert want["outcome"] == "PASS"


def test_without_tool_mask_every_tool_token_would_be_a_mismatch(
    trl_output: dict[str, Any], tmp_path: Path
) -> None:
    """Why the recipe multiplies by tool_mask: the earlier recipe's mask (completion_mask)."""
    out = {k: v for k, v in trl_output.items() if k != "tool_mask"}
    code, result, err = _import(_write_trl(tmp_path / "drift.jsonl", out), tmp_path / "runs")
    assert code == 1, err
    (step,) = result["results"]
    want = _trl_numpy(out, out["completion_mask"])
    assert {k: step[k] for k in want} == want
    tool_tokens = int((trl_output["tool_mask"] == 0).sum())
    assert want["mismatches"] == tool_tokens > 0 and want["max_abs_diff"] > 2.0
