"""``import --follow`` (issue 57) against a real writer process appending a live run's steps.

The follower is ``python -m pytest_logprob_drift import --follow`` in its own process; the
writer is another process copying prepared step files into the log directory, step by step,
driven by handshake (the test creates ``go-<k>`` once the follower printed the line of the step
before), a step file written in pieces (cut mid-line, a pause, the rest) and a slime ``.pt``
copied in chunks. Checked: every step sealed once with all its samples (none half-read), the
signature line at the step an independent numpy computation of the planted outliers names,
exit 4 with ``--exit-on``, a clean exit on idle, SIGINT and SIGTERM, ``verify`` of the followed
run passes, and following again adds nothing and rewrites nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from drift_testing import cli
from production_dumps import (
    Sample,
    make_samples,
    neutral_rows,
    write_jsonl,
    write_nemo_rl_step,
    write_slime_dump,
    write_slime_rank_dumps,
)

pytestmark = pytest.mark.process

WRITER = r"""
import json, os, sys, time
actions = json.loads(sys.argv[1])
for a in actions:
    if a.get("wait"):
        deadline = time.monotonic() + 120
        while not os.path.exists(a["wait"]):
            if time.monotonic() > deadline:
                sys.exit(3)
            time.sleep(0.02)
    data = open(a["src"], "rb").read()
    cuts = a["cuts"]
    mode = "ab" if a.get("append") else "wb"
    with open(a["dst"] + ".part" if a.get("rename") else a["dst"], mode) as f:
        start = 0
        for cut in cuts + [len(data)]:
            f.write(data[start:cut]); f.flush(); os.fsync(f.fileno())
            start = cut
            if cut != len(data):
                time.sleep(a["pause"])
"""


class Follower:
    """The follower process and its stdout lines, read on a thread."""

    def __init__(self, *args: str | Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pytest_logprob_drift", "import", "--follow", *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def until(self, prefix: str) -> str:
        """Wait for the line starting with ``prefix`` (a failure if the follower ends first)."""
        while True:
            line = self.lines.get(timeout=180)
            assert line is not None, f"the follower ended before {prefix!r}: {self.seen}"
            self.seen.append(line)
            if line.startswith(prefix):
                return line

    def finish(self) -> tuple[int, list[str], str]:
        code = self.process.wait(timeout=180)
        self._reader.join(timeout=30)
        while True:
            line = self.lines.get_nowait() if not self.lines.empty() else None
            if line is None:
                break
            self.seen.append(line)
        assert self.process.stderr is not None
        return code, self.seen, self.process.stderr.read()


def _writer(actions: list[dict[str, Any]]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", WRITER, json.dumps(actions)])


def _sample_means(samples: list[Sample]) -> np.ndarray:
    """Each sample's mean |rollout - training| over its loss-masked tokens, in float64."""
    return np.array(
        [
            np.mean(
                [
                    abs(np.float64(r) - np.float64(t))
                    for r, t, m in zip(s.rollout, s.training, s.mask, strict=True)
                    if m == 1
                ]
            )
            for s in samples
        ]
    )


def _has_outliers(means: np.ndarray) -> bool:
    """The documented sample_outliers rule, recomputed here: sorted, the widest neighbour
    ratio at least 10, the samples above it at least 1e-3, one sample below."""
    ordered = np.sort(np.maximum(means, 1e-300))
    ratios = ordered[1:] / ordered[:-1]
    gap = int(np.argmax(ratios))
    return bool(ratios[gap] >= 10.0 and ordered[gap + 1] >= 1e-3)


def _steps(
    seed: int, count: int, planted_at: int | None, offset_at: int | None = None
) -> dict[int, list[Sample]]:
    rng = np.random.default_rng(seed)
    steps = {}
    for k in range(1, count + 1):
        samples = make_samples(rng, 8, lengths=(10, 16))
        if k == planted_at:  # sample 2 far above the rest on every response token
            s = samples[2]
            s.training = [float(np.float32(r - 0.02)) for r in s.rollout]
        if k == offset_at:  # every sample's trainer 0.2 nats below its rollout
            for s in samples:
                s.training = [float(np.float32(r - 0.2)) for r in s.rollout]
        steps[k] = samples
    return steps


def _gate_figures(samples: list[Sample]) -> dict[str, float]:
    """prime-rl's mismatch KL (mean over tokens of exp(d) - d - 1, d = training - rollout)
    and slime's CI figure (the samples' mean of each one's mean |d|), in float64."""
    per_token, per_sample = [], []
    for s in samples:
        d = np.array(
            [np.float64(t) - np.float64(r) for t, r, m in zip(s.training, s.rollout, s.mask,
                                                             strict=True) if m == 1]
        )  # fmt: skip
        per_token.append(d)
        per_sample.append(np.abs(d).mean())
    d = np.concatenate(per_token)
    return {
        "prime_rl_mismatch_kl": float(np.mean(np.exp(d) - d - 1.0)),
        "slime_ci": float(np.mean(per_sample)),
    }


def _printed_value(line: str) -> float:
    return float(line.split("failed: ", 1)[1].split(" ", 1)[0])


def _verify(run_dir: Path) -> str:
    code, out, err = cli("verify", run_dir)
    assert code == 0, out + err
    return out


def _sealed_cases(run_dir: Path) -> dict[str, list[str]]:
    return {
        case.name: sorted(a.name for a in case.iterdir())
        for case in sorted((run_dir / "cases").iterdir())
    }


def test_a_nemo_rl_writer_followed_step_by_step_then_idle(tmp_path: Path) -> None:
    source, log, runs = tmp_path / "source", tmp_path / "log", tmp_path / "runs"
    source.mkdir()
    log.mkdir()
    steps = _steps(7, 4, planted_at=3)
    crossing = [k for k, s in steps.items() if _has_outliers(_sample_means(s))]
    assert crossing == [3]  # the plant, by the rule recomputed here
    actions = []
    for k in steps:
        src = write_nemo_rl_step(source, k, steps[k])
        size = src.stat().st_size
        actions.append(
            {
                "src": str(src),
                "dst": str(log / src.name),
                "wait": None if k == 1 else str(tmp_path / f"go-{k}"),
                # step 3 written in pieces, each cut in the middle of a line
                "cuts": [size // 3, 2 * size // 3] if k == 3 else [],
                "pause": 0.6,  # twice --settle: the cut file sits still past it
            }
        )
    writer = _writer(actions)
    follower = Follower(
        log, "--format", "nemo-rl", "--artifacts", runs, "--idle", "3", "--settle", "0.3",
        "--poll", "0.05", "--experiment-id", "live",
    )  # fmt: skip
    lines = {}
    for k in steps:
        lines[k] = follower.until(f"step {k}: ")
        if k + 1 in steps:
            (tmp_path / f"go-{k + 1}").touch()
    code, seen, err = follower.finish()
    assert writer.wait(timeout=60) == 0
    assert code == 1, [*seen, err]  # step 3 drifts over the threshold: MISMATCH
    for k, samples in steps.items():
        active = sum(sum(s.mask) for s in samples)
        outcome = "MISMATCH" if k == 3 else "PASS"
        assert lines[k].startswith(f"step {k}: {outcome}, 8 samples, ")
        assert f"/{active} mismatching" in lines[k]  # every sample, none half-read
        assert "(sealed: cases/" in lines[k]
    step_lines = [line for line in seen if line.startswith("step ") and "samples" in line]
    assert len(step_lines) == 4  # each step once
    outlier_lines = [line for line in seen if "signature sample_outliers first crossed" in line]
    assert outlier_lines == ["step 3: signature sample_outliers first crossed (sample scope, "
                             "sample row 2)"]  # fmt: skip
    # printed right after step 3's line, before step 4's
    assert seen.index(lines[3]) < seen.index(outlier_lines[0]) < seen.index(lines[4])
    assert seen[-1].startswith("stopped (idle) after 4 step(s)")
    run_dir = runs / "live"
    out = _verify(run_dir)
    assert "4 attempt(s)" in out
    experiment = json.loads((run_dir / "experiment.json").read_text())
    imported = experiment["imported"]
    assert sorted(imported) == [
        "directory",
        "fields",
        "format",
        "max_input_bytes",
        "schema_version",
    ]
    assert imported["schema_version"] == "cross_config.import.v2"  # no whole-run counts
    assert (imported["format"], imported["directory"]) == ("nemo-rl", str(log))
    plan = (run_dir / "plan.jsonl").read_text().splitlines()
    assert [json.loads(row)["label"] for row in plan] == [f"step={k}" for k in steps]
    assert not [p for p in runs.iterdir() if p.name.startswith(".")]  # no staging left

    # following again adds nothing and rewrites nothing
    before = _sealed_cases(run_dir)
    again = Follower(
        log, "--format", "nemo-rl", "--artifacts", runs, "--idle", "0.5", "--settle", "0.3",
        "--poll", "0.05", "--experiment-id", "live",
    )  # fmt: skip
    code, seen, err = again.finish()
    assert code == 1, [*seen, err]
    assert sum("(already sealed: cases/" in line for line in seen) == 4, seen
    assert not any("(sealed: " in line for line in seen)
    assert _sealed_cases(run_dir) == before
    assert (run_dir / "plan.jsonl").read_text().splitlines() == plan
    _verify(run_dir)
    code, out, err = cli("report", run_dir, "--json", "--no-html")
    assert code == 0, err
    named = [(s["id"], s["step"], s["sample"]) for s in json.loads(out)["signatures"]]
    assert named == [("sample_outliers", 3, 2)]  # what the follower printed, at read time


def test_exit_4_at_the_step_that_crosses_the_named_signature(tmp_path: Path) -> None:
    log, runs = tmp_path / "log", tmp_path / "runs"
    log.mkdir()
    steps = _steps(11, 4, planted_at=3)
    for k, samples in steps.items():  # written whole before the follower starts
        write_nemo_rl_step(log, k, samples)
    follower = Follower(
        log, "--format", "nemo-rl", "--artifacts", runs, "--settle", "0.3", "--poll", "0.05",
        "--exit-on", "sample_outliers", "--experiment-id", "gate",
    )  # fmt: skip
    code, seen, err = follower.finish()
    assert code == 4, [*seen, err]
    assert any(line.startswith("step 3: signature sample_outliers first crossed") for line in seen)
    assert not any(line.startswith("step 4:") for line in seen)
    assert seen[-1].startswith("stopped (exit-on) after 3 step(s)")
    assert len(_sealed_cases(runs / "gate")) == 3  # the crossing step sealed, step 4 not
    _verify(runs / "gate")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_slime_dump_copied_in_chunks_then_a_signal(tmp_path: Path, signum: int) -> None:
    source, log, runs = tmp_path / "source", tmp_path / "log", tmp_path / "runs"
    steps = _steps(3, 2, planted_at=None)
    actions = []
    for k, samples in steps.items():
        src = write_slime_dump(source, k, samples)
        (log / "train_data").mkdir(parents=True, exist_ok=True)
        size = src.stat().st_size
        actions.append(
            {
                "src": str(src),
                "dst": str(log / "train_data" / src.name),
                "wait": None if k == 1 else str(tmp_path / f"go-{k}"),
                "cuts": [size // 4, size // 2, 3 * size // 4],
                "pause": 0.4,
            }
        )
    writer = _writer(actions)
    follower = Follower(
        log, "--format", "slime", "--artifacts", runs, "--poll", "0.05", "--experiment-id", "s",
    )  # fmt: skip
    first = follower.until("step 1: ")
    (tmp_path / "go-2").touch()
    second = follower.until("step 2: ")
    assert writer.wait(timeout=60) == 0
    os.kill(follower.process.pid, signum)
    code, seen, err = follower.finish()
    assert code == 0, [*seen, err]
    for k, line in ((1, first), (2, second)):
        active = sum(sum(s.mask) for s in steps[k])
        assert line.startswith(f"step {k}: PASS, 8 samples, 0/{active} mismatching")
    assert seen[-1].startswith(f"stopped ({signal.Signals(signum).name}) after 2 step(s)")
    assert len(_sealed_cases(runs / "s")) == 2
    _verify(runs / "s")


def test_slime_rank_files_sealed_only_with_every_rank(tmp_path: Path) -> None:
    """Per-rank dumps (2 data-parallel ranks): the first rollout is sealed once a later
    rollout's file appeared, the next once it has both ranks; never with one rank."""
    source, log, runs = tmp_path / "source", tmp_path / "log", tmp_path / "runs"
    steps = _steps(13, 2, planted_at=None)
    files = {k: write_slime_rank_dumps(source, k, samples) for k, samples in steps.items()}
    (log / "train_data").mkdir(parents=True)
    order = [(1, 0, None), (1, 1, "go-a"), (2, 0, None), (2, 1, "go-b")]
    writer = _writer(
        [
            {
                "src": str(files[k][rank]),
                "dst": str(log / "train_data" / files[k][rank].name),
                "wait": None if marker is None else str(tmp_path / marker),
                "cuts": [],
                "pause": 0.0,
            }
            for k, rank, marker in order
        ]
    )
    follower = Follower(
        log, "--format", "slime", "--artifacts", runs, "--poll", "0.05", "--experiment-id", "r",
        "--settle", "600",  # a lone rank never settles here: only the later rollout tells
    )  # fmt: skip
    follower.until("following ")  # polling from here on
    # rank 0 of rollout 1 alone for many polls: nothing sealed (the wait only gives the
    # follower the chance to get it wrong; the test cannot pass by a race)
    threading.Event().wait(1.0)
    assert follower.lines.empty() and follower.process.poll() is None
    (tmp_path / "go-a").touch()
    first = follower.until("step 1: ")
    threading.Event().wait(1.0)  # rank 0 of rollout 2 alone: nothing sealed
    assert follower.lines.empty() and follower.process.poll() is None
    (tmp_path / "go-b").touch()
    second = follower.until("step 2: ")
    assert writer.wait(timeout=60) == 0
    os.kill(follower.process.pid, signal.SIGTERM)
    code, seen, err = follower.finish()
    assert code == 0, [*seen, err]
    for k, line in ((1, first), (2, second)):
        active = sum(sum(s.mask) for s in steps[k])
        assert line.startswith(f"step {k}: PASS, 8 samples, 0/{active} mismatching"), line
    _verify(runs / "r")


def test_a_neutral_writer_one_file_a_step(tmp_path: Path) -> None:
    """The neutral format followed as one file per step: a step is complete once a later
    step's file appeared (the newest once it settled); the second written in pieces."""
    source, log, runs = tmp_path / "source", tmp_path / "log", tmp_path / "runs"
    source.mkdir()
    log.mkdir()
    steps = _steps(5, 3, planted_at=2, offset_at=3)
    actions = []
    for k, samples in steps.items():
        src = write_jsonl(source / f"step-{k:06d}.jsonl", neutral_rows(k, samples))
        size = src.stat().st_size
        actions.append(
            {
                "src": str(src),
                "dst": str(log / src.name),
                "wait": None if k == 1 else str(tmp_path / f"go-{k}"),
                "cuts": [size // 2] if k == 2 else [],
                "pause": 0.6,
            }
        )
    writer = _writer(actions)
    follower = Follower(
        log, "--format", "jsonl", "--artifacts", runs, "--idle", "3", "--settle", "0.3",
        "--poll", "0.05", "--experiment-id", "n", "--exit-on", "zero_filled",
    )  # fmt: skip
    lines = {}
    for k in steps:
        lines[k] = follower.until(f"step {k}: ")
        if k + 1 in steps:
            (tmp_path / f"go-{k + 1}").touch()
    code, seen, err = follower.finish()
    assert writer.wait(timeout=60) == 0
    assert code == 1, [*seen, err]  # zero_filled never crossed: no exit 4
    for k, samples in steps.items():
        active = sum(sum(s.mask) for s in samples)
        outcome = "PASS" if k == 1 else "MISMATCH"
        assert lines[k].startswith(f"step {k}: {outcome}, 8 samples, ")
        assert f"/{active} mismatching" in lines[k]
    assert any(line.startswith("step 2: signature sample_outliers first crossed") for line in seen)
    # the offset step: gates first failed there, as the frameworks' formulas computed here say
    gate_lines = [line for line in seen if " gate " in line]
    assert gate_lines and all(line.startswith("step 3: gate ") for line in gate_lines)
    expected = _gate_figures(steps[3])
    assert expected["prime_rl_mismatch_kl"] > 0.015 and expected["slime_ci"] > 0.1
    assert max(_gate_figures(steps[k])["prime_rl_mismatch_kl"] for k in (1, 2)) <= 0.015
    for key, value in expected.items():
        (line,) = [g for g in gate_lines if g.startswith(f"step 3: gate {key} first crossed")]
        assert _printed_value(line) == pytest.approx(value, rel=1e-3)
    # every rollout logprob 0.2 above the trainer's: the truncated-sampling signature
    assert any(line.startswith("step 3: signature truncated_sampling first") for line in seen)
    assert seen[-1].startswith("stopped (idle) after 3 step(s)")
    _verify(runs / "n")


def test_a_single_growing_neutral_file(tmp_path: Path) -> None:
    """One neutral JSONL file the writer appends to, a line cut in two: step k is sealed once
    a whole line of step k+1 follows it (never on a partial line, never on settling: the
    settle time is out of reach), the newest step is left unsealed by SIGINT and sealed by
    the next follow once settled; the steps' lines, digests and case ids are those of an
    import of the whole file at once."""
    source, log, runs = tmp_path / "source", tmp_path / "log", tmp_path / "runs"
    source.mkdir()
    log.mkdir()
    steps = _steps(29, 3, planted_at=None, offset_at=2)
    whole = write_jsonl(
        source / "whole.jsonl",
        [r for k, samples in steps.items() for r in neutral_rows(k, samples)],
    )
    data = whole.read_bytes()
    lines = data.splitlines(keepends=True)
    starts = {k: sum(len(line) for line in lines[: 8 * (k - 1)]) for k in (1, 2, 3)}
    # part a: step 1 and half of step 2's first line; part b: the rest of step 2 and step 3's
    # first line, cut mid-line; part c: the rest of step 3
    cut_a = starts[2] + len(lines[8]) // 2
    cut_b = starts[3] + len(lines[16])
    parts = [data[:cut_a], data[cut_a:cut_b], data[cut_b:]]
    actions = []
    for i, part in enumerate(parts):
        src = source / f"part-{i}"
        src.write_bytes(part)
        actions.append(
            {
                "src": str(src),
                "dst": str(log / "drift.jsonl"),
                "wait": None if i == 0 else str(tmp_path / f"go-{i}"),
                "cuts": [len(part) - 7] if i == 1 else [],
                "pause": 0.3,
                "append": True,
            }
        )
    writer = _writer(actions)
    follower = Follower(
        log, "--format", "jsonl", "--artifacts", runs, "--settle", "600", "--poll", "0.05",
        "--experiment-id", "g",
    )  # fmt: skip
    follower.until("following ")
    threading.Event().wait(1.0)  # step 1 whole, step 2's line half written: nothing sealed
    assert follower.lines.empty() and follower.process.poll() is None
    (tmp_path / "go-1").touch()
    first = follower.until("step 1: ")
    second = follower.until("step 2: ")
    (tmp_path / "go-2").touch()
    assert writer.wait(timeout=60) == 0
    threading.Event().wait(0.5)  # step 3 whole but the newest, unsettled: not sealed
    os.kill(follower.process.pid, signal.SIGINT)
    code, seen, err = follower.finish()
    assert code == 1, [*seen, err]  # step 2 MISMATCH
    assert not [line for line in seen if line.startswith("step 3: ")]
    assert seen[-1].startswith("stopped (SIGINT) after 2 step(s)")
    assert first.startswith(f"step 1: PASS, 8 samples, 0/{sum(sum(s.mask) for s in steps[1])}")
    assert second.startswith("step 2: MISMATCH, 8 samples, ")

    code, out, err = cli(
        "import", "--format", "jsonl", "--follow", log, "--artifacts", runs, "--settle", "0",
        "--idle", "0.3", "--poll", "0.02", "--experiment-id", "g",
    )  # fmt: skip
    assert code == 1, out + err
    assert [
        line.split(" (")[1].split(":")[0] for line in out.splitlines() if "samples" in line
    ] == [
        "already sealed",
        "already sealed",
        "sealed",
    ]
    _verify(runs / "g")
    assert (log / "drift.jsonl").read_bytes() == data
    code, out, err = cli("import", "--format", "jsonl", whole, "--artifacts", runs,
                         "--experiment-id", "at-once")  # fmt: skip
    assert code == 1, out + err
    assert set(_sealed_cases(runs / "g")) == set(_sealed_cases(runs / "at-once"))
    for attempt in (runs / "g").glob("cases/*/*/imported.json"):
        document = json.loads(attempt.read_text())
        k = document["step"]
        own = b"".join(lines[8 * (k - 1) : 8 * k])
        assert document["input_digests"] == [
            {"sha256": hashlib.sha256(own).hexdigest(), "size": len(own)}
        ]
        assert [r["line"] for r in document["rows"]] == list(range(8 * (k - 1) + 1, 8 * k + 1))


def test_a_per_rank_slime_run_of_one_rollout_is_sealed(tmp_path: Path) -> None:
    """Per-rank dumps of a single rollout (no later rollout will tell): sealed with every
    rank once its files settled; a rollout missing rank 0 is never sealed."""
    source, runs = tmp_path / "source", tmp_path / "runs"
    samples = _steps(31, 1, planted_at=None)[1]
    files = write_slime_rank_dumps(source, 1, samples)
    follow = ("import", "--format", "slime", "--follow", source, "--artifacts", runs,
              "--settle", "0.2", "--idle", "1", "--poll", "0.02")  # fmt: skip
    code, out, err = cli(*follow, "--experiment-id", "one")
    assert code == 0, out + err
    active = sum(sum(s.mask) for s in samples)
    assert f"step 1: PASS, 8 samples, 0/{active} mismatching" in out
    (document,) = [
        json.loads(p.read_text()) for p in (runs / "one").glob("cases/*/*/imported.json")
    ]
    assert [Path(p).name for p in document["inputs"]] == [f.name for f in files]
    assert [d["sha256"] for d in document["input_digests"]] == [
        hashlib.sha256(f.read_bytes()).hexdigest() for f in files
    ]
    _verify(runs / "one")

    files[0].unlink()  # rank 1 alone
    code, out, err = cli(*follow, "--experiment-id", "lone")
    assert code == 0, out + err
    assert "step 1:" not in out and "stopped (idle) after 0 step(s)" in out, out

    # a later rollout with more ranks than the first one sealed: one line, exit 2
    more = tmp_path / "more"
    write_slime_rank_dumps(more, 1, samples, dp_size=1)
    later = write_slime_rank_dumps(more, 2, _steps(33, 1, planted_at=None)[1], dp_size=2)
    code, out, err = cli(*follow[:4], more, *follow[5:], "--experiment-id", "more")
    assert code == 2, out + err
    assert "step 1: PASS" in out
    assert f"{later[1]}: rank 1 of rollout 2, where the first rollout sealed had 1 rank(s)" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_neutral_file_that_is_not_followable_is_one_line_exit_2(tmp_path: Path) -> None:
    """A step's lines after another step's, a first line naming no step, and a file cut
    while followed: one line naming the file and line, exit 2; what was sealed stays."""
    log, runs = tmp_path / "log", tmp_path / "runs"
    log.mkdir()
    rows = {k: neutral_rows(k, samples) for k, samples in _steps(37, 2, planted_at=None).items()}
    path = write_jsonl(log / "drift.jsonl", rows[1] + rows[2] + rows[1][:1])
    follow = ("import", "--format", "jsonl", "--follow", log, "--artifacts", runs,
              "--settle", "0", "--idle", "0.3", "--poll", "0.02")  # fmt: skip
    code, out, err = cli(*follow, "--experiment-id", "again")
    assert code == 2, out + err
    assert f"{path}:17: step 1 again, after other steps (first at {path}:1)" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err

    path.write_text('{"sample": 0}\n')
    code, out, err = cli(*follow, "--experiment-id", "nostep")
    assert code == 2, out + err
    assert f"{path}:1: missing field(s) step, " in err, err  # the reader's own refusal
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err

    write_jsonl(path, rows[1] + rows[2][:1])
    follower = Follower(
        log, "--format", "jsonl", "--artifacts", runs, "--settle", "600", "--poll", "0.05",
        "--experiment-id", "cut",
    )  # fmt: skip
    follower.until("step 1: ")
    path.write_bytes(path.read_bytes()[:100])
    code, seen, err = follower.finish()
    assert code == 2, [*seen, err]
    assert f"{path}: replaced or cut while followed" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert len(_sealed_cases(runs / "cut")) == 1
    _verify(runs / "cut")


def test_bad_follow_options_are_one_line_exit_2(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.mkdir()
    for args, needle in (
        (("--format", "nemo-rl", "--follow", log, "--exit-on", "nope"), "'nope' is neither"),
        (("--format", "nemo-rl", "--follow", log / "absent"), "not a directory"),
        (("--format", "nemo-rl", "--follow", log, log), "takes one directory"),
        (("--format", "nemo-rl", "--follow", log, "--settle", "-1"), "--settle -1.0: must be"),
        (("--format", "nemo-rl", "--follow", log, "--idle", "0"), "--idle 0.0: must be"),
        (("--format", "nemo-rl", "--follow", log, "--poll", "nan"), "--poll nan: must be"),
        (("--format", "nemo-rl", "--follow", log, "--json"), "not with --json"),
        (("--format", "nemo-rl", log, "--idle", "1"), "--idle goes with --follow"),
        (("--format", "nemo-rl", log, "--exit-on", "any"), "--exit-on goes with --follow"),
    ):
        code, out, err = cli("import", *args, "--artifacts", tmp_path / "runs")
        assert code == 2, (args, out, err)
        assert needle in err and len(err.strip().splitlines()) == 1, err
        assert "Traceback" not in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_followed_run_is_added_to_only_by_the_same_follow(tmp_path: Path) -> None:
    """In process: an existing run that is not this follow's, and a step sealed from other
    bytes, are one line, exit 2, nothing written; the earlier (whole-run) form still verifies
    with its counts checked, the followed form without them."""
    log, runs = tmp_path / "log", tmp_path / "runs"
    log.mkdir()
    steps = _steps(17, 2, planted_at=None)
    for k, samples in steps.items():
        write_nemo_rl_step(log, k, samples)
    follow = ("import", "--format", "nemo-rl", "--follow", log, "--artifacts", runs)
    timing = ("--settle", "0", "--idle", "0.3", "--poll", "0.02")
    code, out, err = cli(*follow, *timing, "--experiment-id", "f")
    assert code == 0, out + err
    assert out.count("(sealed: cases/") == 2
    before = _sealed_cases(runs / "f")

    # a run imported at once under that name is not added to
    code, out, err = cli("import", "--format", "nemo-rl", log, "--artifacts", runs,
                         "--experiment-id", "whole")  # fmt: skip
    assert code == 0, out + err
    code, out, err = cli(*follow, *timing, "--experiment-id", "whole")
    assert code == 2 and "not a follow of this directory" in err, out + err
    assert len(err.strip().splitlines()) == 1
    whole = json.loads((runs / "whole" / "experiment.json").read_text())["imported"]
    assert (whole["schema_version"], whole["steps"]) == ("cross_config.import.v1", 2)
    _verify(runs / "whole")

    # step 1 rewritten with other numbers: refused, the sealed step untouched
    write_nemo_rl_step(log, 1, _steps(19, 1, planted_at=None)[1])
    code, out, err = cli(*follow, *timing, "--experiment-id", "f")
    assert code == 2, out + err
    assert "step 1 is sealed in" in err and "from other bytes" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert _sealed_cases(runs / "f") == before
    assert not [p for p in runs.iterdir() if p.name.startswith(".")]  # no staging left
    _verify(runs / "f")


def test_a_killed_follower_is_resumed_by_the_next(tmp_path: Path) -> None:
    """SIGKILL after step 1 was sealed: the next follow of the same directory says step 1 is
    already sealed, seals only steps 2 and 3, removes the killed one's staging, and the run
    verifies."""
    log, runs = tmp_path / "log", tmp_path / "runs"
    log.mkdir()
    steps = _steps(23, 3, planted_at=None)
    write_nemo_rl_step(log, 1, steps[1])
    follower = Follower(
        log, "--format", "nemo-rl", "--artifacts", runs, "--settle", "0.2", "--poll", "0.05",
        "--experiment-id", "k",
    )  # fmt: skip
    follower.until("step 1: ")
    abandoned = runs / f".import-{follower.process.pid}-{'0' * 16}"
    abandoned.mkdir()  # what a kill in the middle of a step leaves
    follower.process.kill()
    assert follower.process.wait(timeout=60) == -signal.SIGKILL
    first = _sealed_cases(runs / "k")
    for k in (2, 3):
        write_nemo_rl_step(log, k, steps[k])
    code, out, err = cli(
        "import", "--format", "nemo-rl", "--follow", log, "--artifacts", runs,
        "--settle", "0", "--idle", "0.3", "--poll", "0.02", "--experiment-id", "k",
    )  # fmt: skip
    assert code == 0, out + err
    assert [
        line.split(" (")[1].split(":")[0] for line in out.splitlines() if "samples" in line
    ] == [
        "already sealed",
        "sealed",
        "sealed",
    ]
    after = _sealed_cases(runs / "k")
    assert {c: after[c] for c in first} == first and len(after) == 3
    assert not abandoned.exists()
    _verify(runs / "k")
