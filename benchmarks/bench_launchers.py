"""The ray launcher's overhead: one S0-hf run with FSDP, ``--launcher local`` against ``ray``.

Runs ``python -m pytest_logprob_drift run CONFIG --runtime hf --launcher L --json`` in a fresh
artifact directory for each launcher (``ray`` starts its own local cluster on 127.0.0.1 and
shuts it down: that cost is part of what is measured), and prints per launcher: wall time,
peak resident memory of the whole process tree (the CLI, its FSDP rank processes, or the Ray
head, raylet, workers and rank actors), and the time to the first sealed attempt (the first
``COMPLETE`` file), then the ray/local ratios. Both runs must give the same verdicts.

    python benchmarks/bench_launchers.py                       # S0-hf baseline + sharding=fsdp
    python benchmarks/bench_launchers.py --config experiments/cross_config_s0_hf_tiny.json

Default config: S0-hf cut down to its baseline and ``training.sharding=fsdp`` (the cases that
differ between launchers); ``--repeats N`` runs each launcher N times, alternating, and
reports medians; ``--attached`` adds ``ray-attached``: the run joins a cluster this script
started beforehand (``--ray-address``), so cluster start and shutdown are not in its time.
Peak RSS of ``ray-attached`` counts the run's process tree and the whole cluster (the rank
actors live under the cluster's raylet, which this script started).
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

from bench_experiment_run import _rss_kib, _tree  # the process-tree readers, shared

ROOT = Path(__file__).resolve().parents[1]
S0_HF = ROOT / "experiments" / "cross_config_s0_hf_tiny.json"


def _fsdp_config(directory: Path) -> Path:
    config = json.loads(S0_HF.read_text())
    config["experiment_id"] = "bench-launchers"
    config["interventions"] = [{"path": "training.sharding", "values": ["fsdp"]}]
    path = directory / "bench_launchers.json"
    path.write_text(json.dumps(config))
    return path


def run_once(config: Path, launcher: str, address: str | None = None) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="bench-launchers-") as tmp:
        artifacts = Path(tmp) / "runs"
        command = [
            sys.executable,
            "-m",
            "pytest_logprob_drift",
            "run",
            str(config),
            "--runtime",
            "hf",
            "--launcher",
            launcher,
            "--artifacts",
            str(artifacts),
            "--json",
            *(["--ray-address", address] if address else []),
        ]
        start = time.monotonic()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        peak, first_sealed = 0, None
        # Attached: the cluster's processes (the rank actors among them) are this script's
        # children, so the tree sampled is this script's, less this interpreter.
        root = os.getpid() if address else proc.pid
        while proc.poll() is None:
            tree = [p for p in _tree(root) if p != os.getpid()]
            peak = max(peak, sum(_rss_kib(p) for p in tree))
            if first_sealed is None and any(artifacts.glob("*/cases/*/*/COMPLETE")):
                first_sealed = time.monotonic() - start
            time.sleep(0.2)
        out, err = proc.communicate()
        wall = time.monotonic() - start
        if proc.returncode not in (0, 1):  # 1: some case is not PASS (bf16 cases)
            raise SystemExit(f"{launcher}: exit {proc.returncode}\n{err[-3000:]}")
        document = json.loads(out)
        return {
            "wall_s": wall,
            "peak_rss_mib": peak / 1024,
            "first_sealed_s": first_sealed if first_sealed is not None else wall,
            "outcomes": {r["label"]: r["outcome"] for r in document["results"]},
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--attached",
        action="store_true",
        help="also measure ray-attached: the run joins a cluster this script started before "
        "(--ray-address), the usual case on an RL team's long-lived cluster",
    )
    args = parser.parse_args()
    modes = ["local", "ray"] + (["ray-attached"] if args.attached else [])
    lease = None
    if args.attached:
        from pytest_logprob_drift.execute.launch import Launch
        from pytest_logprob_drift.runtimes import ray_cluster

        lease = ray_cluster.acquire(Launch(launcher="ray"))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            config = args.config or _fsdp_config(Path(tmp))
            runs: dict[str, list[dict[str, object]]] = {mode: [] for mode in modes}
            for _ in range(args.repeats):
                for mode in modes:
                    address = lease.address if mode == "ray-attached" and lease else None
                    runs[mode].append(run_once(config, mode.split("-")[0], address))
    finally:
        if lease is not None:
            lease.release()
    medians: dict[str, dict[str, float]] = {}
    print(f"config: {args.config or 'S0-hf baseline + training.sharding=fsdp'}")
    print(f"repeats: {args.repeats} (medians)")
    print(f"{'launcher':13} {'wall s':>8} {'peak RSS MiB':>13} {'first sealed s':>15}")
    for mode, results in runs.items():
        medians[mode] = {
            key: statistics.median(float(str(r[key])) for r in results)
            for key in ("wall_s", "peak_rss_mib", "first_sealed_s")
        }
        m = medians[mode]
        print(f"{mode:13} {m['wall_s']:8.1f} {m['peak_rss_mib']:13.0f} {m['first_sealed_s']:15.1f}")
    local = medians["local"]
    for mode in modes[1:]:
        m = medians[mode]
        print(
            "ratio {}/local: wall {:.2f}x, peak RSS {:.2f}x, first sealed {:.2f}x".format(
                mode,
                m["wall_s"] / local["wall_s"],
                m["peak_rss_mib"] / local["peak_rss_mib"],
                m["first_sealed_s"] / local["first_sealed_s"],
            )
        )
    same = all(runs[mode][0]["outcomes"] == runs["local"][0]["outcomes"] for mode in modes)
    print(f"verdicts identical: {same} {runs['local'][0]['outcomes']}")


if __name__ == "__main__":
    main()
