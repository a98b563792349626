"""Benchmark of the trainer-to-rollout push (``rollout.weight_sync``): its cost per engine.

Owns how the push's cost is measured; knows nothing else of the framework. The experiment
(default: the shipped ``cross_config_s1_vllm_cpu_weight_sync.json``, whose pairs it lists) runs
through ``logprob-drift run`` in this process into a fresh artifact directory. Timers wrapped
around the vLLM rollout's ``build_engine`` (the engine's construction: vLLM's own load, from
disk or dummy) and ``receive_weights`` (the whole push: the trainer's gather, the previous
policy and its serving for a refit, the chunks, vLLM's layerwise reload, the prefix-cache
reset) give seconds per engine construction; the bytes and chunks are what each case's
read-back sealed (``vllm.weights_arrived``). The wrappers only time: they call the real
methods unchanged.

Usage:
    python benchmarks/bench_weight_sync.py
    python benchmarks/bench_weight_sync.py --config OTHER.json

Prints one JSON document (and a table on stderr).
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from pytest_logprob_drift.cli import main as cli_main  # noqa: E402
from pytest_logprob_drift.runtimes.vllm import adapter as vllm_adapter  # noqa: E402

DEFAULT_CONFIG = REPO_ROOT / "experiments" / "cross_config_s1_vllm_cpu_weight_sync.json"


def _timed(owner: Any, name: str, log: list[tuple[str, str, float]]) -> Callable[[], None]:
    """Wrap ``owner.name`` to append ``(name, rollout fingerprint, seconds)``; returns undo."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            log.append((name, str(self.construction_fingerprint), time.perf_counter() - t0))

    setattr(owner, name, timed)
    return lambda: setattr(owner, name, original)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    args = parser.parse_args()
    log: list[tuple[str, str, float]] = []
    undo = [
        _timed(vllm_adapter.VllmRollout, "build_engine", log),
        _timed(vllm_adapter.VllmRollout, "receive_weights", log),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        out, err = io.StringIO(), io.StringIO()
        argv = [str(args.config), "--runtime", "vllm-hf", "--artifacts", tmp, "--json"]
        t0 = time.perf_counter()
        code = cli_main(["run", *argv, "--pairwise"], out=out, err=err)
        wall = time.perf_counter() - t0
        for u in undo:
            u()
        if code not in (0, 1):
            print(err.getvalue(), file=sys.stderr)
            return code
        results = json.loads(out.getvalue())["results"]
        build = {fp: s for name, fp, s in log if name == "build_engine"}
        push = {fp: s for name, fp, s in log if name == "receive_weights"}
        rows = []
        for r in results:
            actual = json.loads((Path(r["attempt_dir"]) / "actual.json").read_text())
            read_back = actual["read_back"]
            arrived = json.loads(read_back.get("vllm.weights_arrived") or "{}")
            rows.append(
                {
                    "label": r["label"],
                    "weight_sync": read_back.get("rollout.weight_sync"),
                    "chunks": arrived.get("chunks"),
                    "tensor_bytes": arrived.get("tensor_bytes"),
                    "payload_bytes": arrived.get("payload_bytes"),
                    "gather_s": arrived.get("gather_s"),
                    "reload_s": arrived.get("seconds"),
                    "previous_policy_reload_s": (arrived.get("previous_policy") or {}).get(
                        "seconds"
                    ),
                }
            )
    document = {
        "config": str(args.config),
        "wall_s": round(wall, 1),
        "engine_builds_s": sorted(round(s, 2) for s in build.values()),
        "pushes_s": sorted(round(s, 3) for s in push.values()),
        "cases": rows,
    }
    print(json.dumps(document, indent=1))
    print(
        f"{'case':66} {'sync':14} {'chunks':>6} {'MB':>7} {'gather s':>9} {'reload s':>9}",
        file=sys.stderr,
    )
    for row in rows:
        if not row["chunks"]:
            continue
        print(
            f"{row['label']:66} {row['weight_sync']:14} {row['chunks']:>6} "
            f"{row['tensor_bytes'] / 1e6:>7.2f} {row['gather_s']:>9.4f} {row['reload_s']:>9.4f}",
            file=sys.stderr,
        )
    print(f"engine builds (s): {document['engine_builds_s']}", file=sys.stderr)
    print(f"whole pushes, receive_weights (s): {document['pushes_s']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
