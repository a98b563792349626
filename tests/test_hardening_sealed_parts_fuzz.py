"""Property test: re-sealed hostile layer, replay and importance-sampling parts never crash
``verify`` or ``report``, and a changed sealed value is refused naming a file or recomputes
equal (issue 40).

In the style of ``test_hardening_sealed_fuzz`` (whose fork server, bounds and mutations it
reuses), over the parts that test's run has not: one run with every optional part is sealed
once per module (``tests/sealed_parts.py``: the smoke runtime with a layer capture and
replays; layers at 3 positions per row, replay, importance sampling). Each example copies it,
rewrites one of: comparison.json at a path under ``diagnostics.layers``,
``diagnostics.path_split`` or ``diagnostics.importance_sampling`` (a wrong type, a missing or
extra key, a plausible other value, nesting, NaN/Infinity and huge literals, non-UTF-8 bytes),
or one tensor file ``layers_training.pt``, ``layers_rollout.pt``, ``score_rollout_prefill.pt``,
``score_rollout_decode_replay.pt`` (another dtype, rank or shape, stride 0, missing or extra
tensors, no mapping, truncated, NaN, one element changed), re-seals it
(``tests/resealing.py``) and runs ``verify --json`` and ``report`` (text or ``--json``; every
report renders the page) in forked processes under the fuzz test's bounds. The property:

- neither ends in exit 3, a traceback, or anything on stderr (a warning included); verify
  exits 0 or 1 and report 0;
- when the attempt is invalid, verify names one of its files, in one line;
- when verify says it is ok, the change is one no check can see: comparison.json equal but
  for what an engine records about itself (a status's ``evidence``, bar the layer counts, and
  ``reason``), or tensors whose figures recompute equal (``numerics.layer_reduction.compare``,
  ``numerics.path_split.path_split``) with the same positions, masks and sampled tokens.
"""

from __future__ import annotations

import io
import json
import math
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_processes import Bounded, Finished, ForkServer, bounded
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pytest_logprob_drift.numerics.layer_reduction import compare
from pytest_logprob_drift.numerics.path_split import path_split
from tests import sealed_parts
from tests.resealing import reseal
from tests.test_hardening_sealed_fuzz import (
    CPU_SECONDS,
    MEMORY_BYTES,
    PLACEHOLDER,
    _nested,
    _paths,
    _set,
    raw_literals,
    tensor_mutation,
    wrong_values,
)

pytestmark = [pytest.mark.slow, pytest.mark.process]  # each example renders a report page (seconds)

EXAMPLES = 20
PARTS = ("layers", "path_split", "importance_sampling")
TENSOR_TARGETS = (
    "layers_training.pt",
    "layers_rollout.pt",
    "score_rollout_prefill.pt",
    "score_rollout_decode_replay.pt",
)
LAYER_COUNTS = ("states", "decoder_layers", "positions")
"""The members of a layer status's evidence that verify checks against the sealed tensors."""
STRINGS = (
    "layers_captured",
    "layers_unavailable",
    "replay_ran",
    "replay_incomparable",
    "replay_unavailable",
    "0",
    "1",
    "final_norm",
    "logits",
)


@pytest.fixture(scope="module")
def server(cli_process: ForkServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bounded]:
    scratch = tmp_path_factory.mktemp("fork-server")
    with bounded(cli_process, scratch, seconds=CPU_SECONDS, memory_bytes=MEMORY_BYTES) as serving:
        yield serving


@pytest.fixture(scope="module")
def pristine(server: Bounded, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = sealed_parts.sealed_run(tmp_path_factory.mktemp("sealed-parts"))
    page = tmp_path_factory.mktemp("warm") / "page.html"
    assert server.warm("report", run_dir, "--html", page) == 0
    page.unlink()
    return run_dir


# --------------------------------------------------------------------------- mutations


def _other_value(draw: st.DrawFn, value: Any) -> Any:
    """A plausible value of the same kind that differs from ``value``."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + draw(st.sampled_from([1, 2, -1, 7, 1 << 20]))
    if isinstance(value, float):
        return draw(st.sampled_from([value * 2 + 1e-3, -value - 1e-3, 0.0 if value else 1.0]))
    if isinstance(value, str):
        return draw(st.sampled_from([s for s in STRINGS if s != value]))
    if value is None:
        return draw(st.sampled_from([0, 0.5, "0"]))
    return draw(wrong_values)


def json_mutation(draw: st.DrawFn, document: Any) -> tuple[str, bytes]:
    """A description and the new bytes of comparison.json, changed under one of ``PARTS``."""
    paths = [p for p in _paths(document) if len(p) >= 2 and p[0] == "diagnostics" and p[1] in PARTS]
    path = draw(st.sampled_from(paths))
    kinds = ["value", "type", "delete", "extra", "nest", "raw", "non-utf8"]
    kind = draw(st.sampled_from(kinds))
    doc = json.loads(json.dumps(document))
    target = doc
    for step in path:
        target = target[step]
    if kind == "value":
        doc = _set(doc, path, _other_value(draw, target))
    elif kind == "type":
        doc = _set(doc, path, draw(wrong_values))
    elif kind == "delete":
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        del parent[path[-1]]
    elif kind == "extra":
        if isinstance(target, dict):
            target[draw(st.text(min_size=1, max_size=6))] = draw(wrong_values)
        elif isinstance(target, list):
            target.append(draw(wrong_values))
        else:
            doc = _set(doc, path, [target, draw(wrong_values)])
    elif kind == "nest":
        doc = _set(doc, path, _nested(draw(st.sampled_from([100, 990]))))
    data = json.dumps(doc, indent=1, sort_keys=True).encode()
    if kind in ("raw", "non-utf8"):
        data = json.dumps(_set(doc, path, PLACEHOLDER), sort_keys=True).encode()
        replacement = (
            draw(raw_literals).encode()
            if kind == "raw"
            else b'"\xff\xfe\xc3(' + draw(st.binary(max_size=4)) + b'"'
        )
        data = data.replace(json.dumps(PLACEHOLDER).encode(), replacement)
    return f"{kind} at {list(path)!r}", data


def _tensor_file(tensors: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    return buffer.getvalue()


def value_mutation(draw: st.DrawFn, tensors: dict[str, torch.Tensor]) -> tuple[str, bytes]:
    """One element of one tensor changed, dtype and shape kept."""
    name = draw(st.sampled_from(sorted(tensors)))
    tensor = tensors[name].clone()
    flat = tensor.reshape(-1)
    if flat.numel() == 0:
        return f"nothing to change in {name}", _tensor_file(tensors)
    index = draw(st.integers(min_value=0, max_value=flat.numel() - 1))
    if tensor.dtype == torch.bool:
        flat[index] = not bool(flat[index])
    elif tensor.dtype == torch.uint8:
        flat[index] = int(flat[index]) ^ draw(st.sampled_from([1, 128]))
    elif tensor.is_floating_point():
        flat[index] = draw(st.sampled_from([0.0, float(flat[index]) + 1.0, -float(flat[index])]))
    else:
        flat[index] = int(flat[index]) + draw(st.sampled_from([1, -1, 1000]))
    return f"value of {name}[{index}]", _tensor_file({**tensors, name: tensor})


# --------------------------------------------------------------------------- the oracle


def _engine_free(document: Any) -> Any:
    """comparison.json without what an engine records about itself: every ``reason``, a
    replay status's ``evidence`` and a layer status's evidence bar ``LAYER_COUNTS``."""
    doc = json.loads(json.dumps(document))
    diagnostics = doc.get("diagnostics", {}) if isinstance(doc, dict) else {}
    for part, sides, keep in (
        ("layers", ("training", "rollout"), LAYER_COUNTS),
        ("path_split", ("prefill", "decode_replay"), ()),
    ):
        record = diagnostics.get(part) if isinstance(diagnostics, dict) else None
        for side in sides if isinstance(record, dict) else ():
            status = record.get(side)
            if not isinstance(status, dict):
                continue
            status.pop("reason", None)
            evidence = status.get("evidence")
            if isinstance(evidence, dict):
                status["evidence"] = {k: v for k, v in evidence.items() if k in keep}
    return doc


def _same_layout(before: dict[str, torch.Tensor], after: Any) -> bool:
    return (
        isinstance(after, dict)
        and set(after) == set(before)
        and all(
            isinstance(after[k], torch.Tensor)
            and after[k].dtype == before[k].dtype
            and after[k].shape == before[k].shape
            for k in before
        )
    )


def _layers_equal(recorded: dict[str, Any], training: Any, rollout: Any) -> bool:
    got = compare(training, rollout)
    if (got["positions"], got["first_unequal_state"]) != (
        recorded["positions"],
        recorded["first_unequal_state"],
    ):
        return False
    for a, b in zip(got["states"], recorded["states"], strict=True):
        if (a["state"], a["bitwise_equal_share"]) != (b["state"], b["bitwise_equal_share"]):
            return False
        for key in ("median_rel_error", "max_rel_error", "median_cosine"):
            if not math.isclose(a[key], b[key], rel_tol=1e-12, abs_tol=1e-300):
                return False
    return True


def _replay_equal(attempt: Path, name: str, replay: dict[str, torch.Tensor]) -> bool:
    rollout = torch.load(attempt / "score_rollout.pt", weights_only=True)
    training = torch.load(attempt / "score_training.pt", weights_only=True)
    attention, active = rollout["attention_mask"], rollout["active_mask"]
    if not (
        torch.equal(replay["attention_mask"], attention)
        and torch.equal(replay["active_mask"], active)
        and torch.equal(replay["token_ids"][attention], rollout["token_ids"][attention])
        and bool((replay["logprobs"][~active].view(torch.int32) == 0).all())
    ):
        return False
    split = json.loads((attempt / "comparison.json").read_text())["diagnostics"]["path_split"]
    files = {
        n: torch.load(attempt / n, weights_only=True)
        for n in ("score_rollout_prefill.pt", "score_rollout_decode_replay.pt")
    }
    files[name] = replay
    got = path_split(
        decode=rollout["logprobs"],
        prefill=files["score_rollout_prefill.pt"]["logprobs"],
        training=training["logprobs"],
        active=active,
        comparable=split["comparable"],
        decode_replay=files["score_rollout_decode_replay.pt"]["logprobs"],
    )
    return bool(json.loads(json.dumps(got)) == split["figures"])


def invisible(pristine_attempt: Path, target: str, data: bytes) -> bool:
    """Whether rewriting ``target`` of the attempt with ``data`` changes nothing a check can
    see (the oracle for an attempt verify still calls ok)."""
    original = (pristine_attempt / target).read_bytes()
    if target == "comparison.json":
        try:
            mutated = json.loads(data)
        except ValueError:
            return False
        return bool(_engine_free(mutated) == _engine_free(json.loads(original)))
    before = torch.load(io.BytesIO(original), weights_only=True)
    try:
        after = torch.load(io.BytesIO(data), weights_only=True)
    except Exception:
        return False
    if not _same_layout(before, after):
        return False
    if target.startswith("layers_"):
        if not torch.equal(after["positions"], before["positions"]):
            return False
        other = "layers_rollout.pt" if target == "layers_training.pt" else "layers_training.pt"
        sides = {target: after, other: torch.load(pristine_attempt / other, weights_only=True)}
        recorded = json.loads((pristine_attempt / "comparison.json").read_text())
        try:
            return _layers_equal(
                recorded["diagnostics"]["layers"]["figures"],
                sides["layers_training.pt"],
                sides["layers_rollout.pt"],
            )
        except ValueError:
            return False
    try:
        return _replay_equal(pristine_attempt, target, after)
    except ValueError:
        return False


# --------------------------------------------------------------------------- the property


def _check(note: str, finished: Finished, codes: tuple[int, ...]) -> None:
    try:
        assert finished.signal is None
        assert "Traceback" not in finished.stdout + finished.stderr
        assert finished.code in codes
        assert finished.stderr == ""
    except AssertionError as exc:
        raise AssertionError(f"{note}\n{finished.describe()}") from exc


def exercise(draw: st.DrawFn, server: Bounded, pristine: Path) -> None:
    example = Path(tempfile.mkdtemp(prefix="example-", dir=server.scratch))
    shutil.copytree(pristine.parent, example / "runs")
    run_dir = example / "runs" / sealed_parts.EXPERIMENT
    attempts = sorted(p.parent for p in pristine.glob("cases/*/*/COMPLETE"))
    pristine_attempt = draw(st.sampled_from(attempts))
    attempt = run_dir / pristine_attempt.relative_to(pristine)
    if draw(st.booleans()):
        target = "comparison.json"
        what, data = json_mutation(draw, json.loads((attempt / target).read_text()))
    else:
        target = draw(st.sampled_from(TENSOR_TARGETS))
        raw = (attempt / target).read_bytes()
        tensors = torch.load(attempt / target, weights_only=True)
        if draw(st.booleans()):
            what, data = value_mutation(draw, tensors)
        else:
            what, data = tensor_mutation(draw, tensors, raw)
    (attempt / target).write_bytes(data)
    reseal(run_dir, attempt / target)
    note = f"{attempt.parent.name}/{target}: {what}"

    verified = server("verify", run_dir, "--json")
    _check(note, verified, (0, 1))
    entries = {a["attempt_id"]: a for a in json.loads(verified.stdout)["attempts"]}
    entry = entries[attempt.name]
    try:
        if entry["status"] == "invalid":
            assert (attempt / entry["file"]).is_file(), entry
            assert "\n" not in entry["detail"]
        else:
            assert invisible(pristine_attempt, target, data), entry
        assert all(e["status"] == "ok" for k, e in entries.items() if k != attempt.name)
    except AssertionError as exc:
        raise AssertionError(f"{note}\n{verified.describe()}") from exc

    page = example / "page.html"
    mode = ("--json",) if draw(st.booleans()) else ()
    _check(note, server("report", run_dir, *mode, "--html", page), (0,))
    shutil.rmtree(example)


@given(data=st.data())
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate),  # a shrink would cost hundreds of processes
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_resealed_hostile_part_gives_a_verdict_naming_a_file_or_recomputes_equal(
    data: st.DataObject, server: Bounded, pristine: Path
) -> None:
    exercise(data.draw, server, pristine)
