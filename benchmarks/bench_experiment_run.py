"""Wall time, peak memory and engine/process counts of one whole `run` of an experiment.

Runs ``python -m pytest_logprob_drift run CONFIG --runtime NAME --json`` in a fresh artifact
directory, samples the resident memory of the whole process tree (the CLI, vLLM engine cores
and workers, FSDP ranks) every 0.2 s from /proc, and prints: wall time, peak tree RSS, the
verdict table (outcome, max |diff|, mismatch ratio per case), engine constructions against the
minimum the plan needs (distinct construction fingerprints), and process launches (distinct
child processes seen) against the minimum (rollout engines x their processes + one FSDP group
of 2 ranks per distinct sharded training fingerprint).

    python benchmarks/bench_experiment_run.py experiments/cross_config_s0_hf_tiny.json hf
    python benchmarks/bench_experiment_run.py experiments/cross_config_s1_vllm_cpu_tiny.json vllm-hf
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                out.extend(int(c) for c in handle.read().split())
        except OSError:
            continue
    return out


def _tree(root: int) -> list[int]:
    seen, stack = [], [root]
    while stack:
        pid = stack.pop()
        seen.append(pid)
        stack.extend(_children(pid))
    return seen


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _kind(cmdline: str) -> str:
    if "VLLM::EngineCore" in cmdline or "EngineCore" in cmdline:
        return "vLLM engine core"
    if "VLLM::Worker" in cmdline or "VllmWorker" in cmdline:
        return "vLLM worker"
    if "fsdp_scoring" in cmdline:
        return "FSDP rank"
    if "resource_tracker" in cmdline:
        return "multiprocessing resource tracker"
    if "compile_worker" in cmdline or "inductor" in cmdline:
        return "torch inductor compile worker"
    return "other (" + (cmdline.split(" ")[0].rsplit("/", 1)[-1] or "?") + ")"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("runtime")
    parser.add_argument("--expect", action="append", default=[])
    args = parser.parse_args()
    artifacts = Path(tempfile.mkdtemp(prefix="bench-run-"))
    command = [
        sys.executable,
        "-m",
        "pytest_logprob_drift",
        "run",
        args.config,
        "--runtime",
        args.runtime,
        "--artifacts",
        str(artifacts),
        "--json",
    ]
    for expect in args.expect:
        command += ["--expect", expect]
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    peak = 0
    launched: dict[int, str] = {}
    while proc.poll() is None:
        tree = _tree(proc.pid)
        peak = max(peak, sum(_rss_kib(pid) for pid in tree))
        for pid in tree[1:]:
            title = _cmdline(pid)[:120]  # vLLM renames its processes after start: keep latest
            if title:
                launched[pid] = title
        time.sleep(0.2)
    wall = time.monotonic() - start
    stdout = proc.stdout.read() if proc.stdout else ""
    # Engines may log to stdout too; the report is the last top-level JSON object.
    lines = stdout.splitlines()
    start = max(i for i, line in enumerate(lines) if line == "{")
    report = json.loads("\n".join(lines[start:]))

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from pytest_logprob_drift import plan_file
    from pytest_logprob_drift.execute.protocol import bind_case

    plan = plan_file(args.config)
    bindings = [
        bind_case(
            ec,
            runtime_kind=args.runtime,
            identity=plan.plan.identity,
            device=plan.plan.scenario.device,
        )
        for ec in plan.cases
    ]
    rollout_min = len({b.rollout_construction_fingerprint for b in bindings})
    training_min = len({b.training_construction_fingerprint for b in bindings})
    fsdp_groups = len(
        {
            b.training_construction_fingerprint
            for b in bindings
            if b.training.get("sharding") == "fsdp"
        }
    )

    print(f"experiment {args.config} runtime {args.runtime}")
    print(f"wall time {wall:.1f} s, peak RSS of the process tree {peak / 1024 / 1024:.2f} GiB")
    print("| case | outcome | max abs diff | mismatch ratio | attempt |")
    print("|---|---|---|---|---|")
    for r in report["results"]:
        ratio = (r["mismatches"] / r["active_tokens"]) if r["active_tokens"] else None
        diff = "-" if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.2e}"
        print(
            f"| {r['label']} | {r['outcome']} | {diff} | "
            f"{'-' if ratio is None else f'{ratio:.3f}'} | "
            f"{'reused' if r['reused'] else 'new'} |"
        )
    counts = report["engine_constructions"]
    print(
        f"engine constructions: rollout {counts['rollout']} (minimum {rollout_min}), "
        f"training {counts['training']} (minimum {training_min})"
    )
    kinds = Counter(_kind(c) for c in launched.values())
    engine_cores = kinds.get("vLLM engine core", 0)
    workers = kinds.get("vLLM worker", 0)
    tp_needed = sum(
        int(str(b.rollout.get("tensor_parallel_size", 1)))
        for b in {b.rollout_construction_fingerprint: b for b in bindings}.values()
    )
    print(
        f"child processes seen: {len(launched)}: "
        + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    )
    print(f"FSDP rank processes {kinds.get('FSDP rank', 0)} (minimum {2 * fsdp_groups})")
    if args.runtime == "vllm-hf":
        print(
            f"vLLM engine cores {engine_cores} (minimum {rollout_min}), vLLM workers "
            f"{workers} (minimum {tp_needed})"
        )
    print(f"failures: {report['failures']}")
    ok = (
        counts["rollout"] == rollout_min
        and counts["training"] == training_min
        and not report["failures"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
