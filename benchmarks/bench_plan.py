"""Benchmark: wall time of ``python -m pytest_logprob_drift plan`` on a 256-case config.

Writes a config (in a temporary directory) that expands to exactly the 256-case framework cap,
mixing one-at-a-time values on every knob with three listed pairwise pairs, then times the whole
``plan`` process against ``python -c pass`` (interpreter start-up) in the same run: best and
median of N runs each, and their ratio. Both run with bytecode caching on (an installed package
has its ``.pyc`` files; ``PYTHONDONTWRITEBYTECODE`` would make every run recompile the package)
into a temporary ``PYTHONPYCACHEPREFIX``, warmed once before measuring. With ``--importtime``
it also prints the slowest imports of one ``plan`` (``-X importtime``). Exits nonzero if the
plan does not have 256 cases or the ``plan`` process fails.

    .venv/bin/python benchmarks/bench_plan.py [--runs 5] [--importtime]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

EXPECTED_CASES = 256
BATCH_SIZES = [v for v in range(1, 216) if v != 8]  # 214 values besides the baseline


def config_document() -> dict[str, Any]:
    # 1 baseline + OAT (214 + 4 + 3 + 2 + 1 + 1 + 3 + 2 + 2 + 1 = 233) + pairs (12 + 4 + 6 = 22)
    return {
        "schema_version": "cross_config.experiment_config.v1",
        "experiment_id": "bench-256",
        "scenario_id": "bench-256-cuda",
        "description": "benchmark: exactly 256 planned cases",
        "contract_source": "ws1",
        "contract_version": "current",
        "strategy": "pairwise",
        "strict_fallback": True,
        "identity": {
            "checkpoint": {"uri": "/models/Qwen3-8B", "model_version": "qwen3-8b-base"},
            "tokenizer": {"id": "Qwen/Qwen3-8B"},
            "prompts": {"token_ids": [[151644, 872, 198, 22043, 264, 3364]]},
            "sampling": {"seed": 0, "max_new_tokens": 1024, "temperature": 1.0},
        },
        "baseline": {
            "batch": {"size": 8},
            "rollout": {
                "tensor_parallel_size": 4,
                "context_parallel_size": 4,
                "dtype": "bfloat16",
                "enable_prefix_caching": True,
                "enforce_eager": False,
            },
            "training": {
                "attention_backend": "flash_attention_2",
                "compute_dtype": "bfloat16",
                "sharding": "fsdp",
            },
            "logp": {"backend": "native"},
        },
        "interventions": [
            {"path": "batch.size", "values": BATCH_SIZES},
            {"path": "rollout.tensor_parallel_size", "values": [1, 2, 8, 16]},
            {"path": "rollout.context_parallel_size", "values": [1, 2, 8]},
            {"path": "rollout.dtype", "values": ["float32", "float16"]},
            {"path": "rollout.enable_prefix_caching", "values": [False]},
            {"path": "rollout.enforce_eager", "values": [True]},
            {"path": "training.attention_backend", "values": ["eager", "sdpa", "flex_attention"]},
            {"path": "training.compute_dtype", "values": ["float32", "float16"]},
            {
                "path": "logp.backend",
                "values": ["rlkernel.reference_logp", "rlkernel.chunked_logp"],
            },
            {"path": "training.sharding", "values": ["none"]},
        ],
        "pairs": [
            ["rollout.tensor_parallel_size", "rollout.context_parallel_size"],
            ["rollout.dtype", "training.compute_dtype"],
            ["logp.backend", "training.attention_backend"],
        ],
        "scenario": {"level": "S3", "device": "cuda"},
    }


ENV: dict[str, str] = {}


def timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, env=ENV)
    return time.perf_counter() - start, result


def slowest_imports(plan_cmd: list[str], count: int = 12) -> list[str]:
    """The ``count`` imports with the largest self time in one ``plan`` process."""
    result = timed([plan_cmd[0], "-X", "importtime", *plan_cmd[1:]])[1]
    rows = []
    for line in result.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[0].strip().isdigit():
            rows.append((int(parts[0]), int(parts[1]), parts[2].strip()))
    return [
        f"{own / 1000:6.1f} ms self {total / 1000:6.1f} ms total  {name}"
        for own, total, name in sorted(rows, reverse=True)[:count]
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--importtime", action="store_true", help="also show the slowest imports")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
        ENV.update(os.environ)
        ENV.pop("PYTHONDONTWRITEBYTECODE", None)
        ENV["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        config = Path(tmp) / "bench_256.json"
        config.write_text(json.dumps(config_document(), indent=2), encoding="utf-8")
        plan_cmd = [sys.executable, "-m", "pytest_logprob_drift", "plan", str(config)]
        pass_cmd = [sys.executable, "-c", "pass"]

        _, check = timed([*plan_cmd, "--json"])
        if check.returncode != 0:
            print(
                f"plan --json failed (exit {check.returncode}):\n{check.stderr}{check.stdout}",
                file=sys.stderr,
            )
            return 1
        document = json.loads(check.stdout)
        cases = len(document["cases"])
        errors = [i for i in document["issues"] if i["severity"] == "error"]
        if cases != EXPECTED_CASES or errors:
            print(
                f"expected {EXPECTED_CASES} cases and no errors, got {cases} cases, "
                f"{len(errors)} errors",
                file=sys.stderr,
            )
            return 1

        timed(plan_cmd)  # warm the file and bytecode caches for both before measuring
        timed(pass_cmd)
        imports = slowest_imports(plan_cmd) if args.importtime else []
        plan_times: list[float] = []
        pass_times: list[float] = []
        for _ in range(args.runs):  # interleaved, so machine load affects both alike
            elapsed, result = timed(plan_cmd)
            if result.returncode != 0 or f"{EXPECTED_CASES} case(s)" not in result.stdout:
                print(f"plan failed (exit {result.returncode}):\n{result.stderr}", file=sys.stderr)
                return 1
            plan_times.append(elapsed)
            pass_times.append(timed(pass_cmd)[0])

    plan_best, plan_median = min(plan_times), statistics.median(plan_times)
    pass_best, pass_median = min(pass_times), statistics.median(pass_times)
    print(
        f"config: {cases} cases (1 baseline, "
        f"{sum(c['kind'] == 'one_at_a_time' for c in document['cases'])} one-at-a-time, "
        f"{sum(c['kind'] == 'pairwise' for c in document['cases'])} pairwise); "
        f"runs: {args.runs}; python {sys.version.split()[0]}"
    )
    print(f"plan 256 cases   best {plan_best * 1000:8.1f} ms   median {plan_median * 1000:8.1f} ms")
    print(f"python -c pass   best {pass_best * 1000:8.1f} ms   median {pass_median * 1000:8.1f} ms")
    print(
        f"ratio plan/pass  best {plan_best / pass_best:8.2f}x     "
        f"median {plan_median / pass_median:8.2f}x"
    )
    for line in imports:
        print(f"  import {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
