"""Benchmark of the opt-in replay (``diagnostics.replay``): its extra wall time per case.

Owns the target of issue 22 (the prefill replay costs at most 0.5x the case's own scoring
time, engine starts excluded, since the replay reuses the case's engine) and how it is
measured; knows nothing else of the framework. The experiment (default: the shipped S1 bf16
vLLM experiment) runs twice through ``logprob-drift run`` in this process, into fresh artifact
directories: without replay, then with ``diagnostics.replay`` on. Per case, timers wrapped
around the rollout's ``generate`` and the trainer's ``score`` (the case's scoring; engine
construction is outside them) and around ``execute.case.replay_diagnostics`` (both replays,
their token checks and the figures) give the scoring and replay seconds; each run's total wall
time is reported too. The wrappers only time: they call the real methods unchanged.

Usage:
    python benchmarks/bench_replay.py                       # S1 bf16 on vllm-hf
    python benchmarks/bench_replay.py --config experiments/cross_config_s0_hf_tiny_bf16.json \
        --runtime hf

Prints one JSON document (and a table on stderr). Exits 1 when a case misses the target.
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
from pytest_logprob_drift.execute import case as case_module  # noqa: E402

DEFAULT_CONFIG = REPO_ROOT / "experiments" / "cross_config_s1_vllm_cpu_tiny_bf16.json"
TARGET = 0.5
"""Prefill replay seconds / the case's scoring seconds (generate + score), at most."""

_current: list[str] = [""]
_seconds: dict[str, dict[str, float]] = {}


def _timed(kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            bucket = _seconds.setdefault(_current[0], {})
            bucket[kind] = bucket.get(kind, 0.0) + time.perf_counter() - start

    return wrapper


def _install(runtime: str) -> None:
    original_execute = case_module.execute_case

    @functools.wraps(original_execute)
    def execute(run: Any) -> Any:
        _current[0] = run.ec.case.label
        return original_execute(run)

    import pytest_logprob_drift.execute.runner as runner_module

    runner_module.execute_case = execute  # type: ignore[assignment]
    case_module.replay_diagnostics = _timed("replay", case_module.replay_diagnostics)  # type: ignore[assignment]
    from pytest_logprob_drift.runtimes.transformers import adapter as hf

    hf.HfTrainingScorer.score = _timed("score", hf.HfTrainingScorer.score)  # type: ignore[method-assign]
    if runtime == "vllm-hf":
        from pytest_logprob_drift.runtimes.vllm import adapter as vllm_adapter

        vllm_adapter.VllmRollout.generate = _timed(  # type: ignore[method-assign]
            "generate", vllm_adapter.VllmRollout.generate
        )
    else:
        hf.HfRollout.generate = _timed("generate", hf.HfRollout.generate)  # type: ignore[method-assign]


def _run(config: dict[str, Any], runtime: str, directory: Path, replay: bool) -> dict[str, Any]:
    document = dict(config)
    if replay:
        document["diagnostics"] = {**document.get("diagnostics", {}), "replay": True}
    path = directory / f"{'on' if replay else 'off'}.json"
    path.write_text(json.dumps(document))
    _seconds.clear()
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    code = cli_main(
        ["run", str(path), "--runtime", runtime, "--artifacts", str(directory / path.stem)],
        out=out,
        err=err,
    )
    wall = time.perf_counter() - start
    if code not in (0, 1):
        raise SystemExit(f"run failed ({code}): {err.getvalue()[-2000:]}")
    return {"wall_s": wall, "cases": {k: dict(v) for k, v in _seconds.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--runtime", default="vllm-hf")
    parser.add_argument(
        "--keep", type=Path, help="keep both runs' artifacts under this new directory"
    )
    args = parser.parse_args(argv)
    config = json.loads(args.config.read_text())
    _install(args.runtime)
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        where = Path(tmp) if args.keep is None else args.keep
        where.mkdir(parents=True, exist_ok=args.keep is None)
        off = _run(config, args.runtime, where, replay=False)
        on = _run(config, args.runtime, where, replay=True)
    rows, missed = [], []
    for label, seconds in on["cases"].items():
        scoring = seconds.get("generate", 0.0) + seconds.get("score", 0.0)
        replay = seconds.get("replay", 0.0)
        ratio = replay / scoring if scoring else None
        rows.append(
            {"case": label, "scoring_s": scoring, "replay_s": replay, "replay_over_scoring": ratio}
        )
        if ratio is None or ratio > TARGET:
            missed.append(label)
    result = {
        "config": str(args.config),
        "runtime": args.runtime,
        "target_replay_over_scoring": TARGET,
        "wall_s": {"replay_off": off["wall_s"], "replay_on": on["wall_s"]},
        "cases": rows,
        "missed": missed,
    }
    print(json.dumps(result, indent=2))
    print(f"{'case':40} {'scoring s':>10} {'replay s':>10} {'ratio':>7}", file=sys.stderr)
    for row in rows:
        ratio = row["replay_over_scoring"]
        print(
            f"{row['case']:40} {row['scoring_s']:10.3f} {row['replay_s']:10.3f} "
            f"{'-' if ratio is None else format(ratio, '.3f'):>7}",
            file=sys.stderr,
        )
    print(
        f"run wall: {off['wall_s']:.1f} s without replay, {on['wall_s']:.1f} s with it",
        file=sys.stderr,
    )
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
