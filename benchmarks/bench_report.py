"""Benchmark: the HTML report of a 256-case run with 100k active tokens per case, against verify.

Builds (not timed) a synthetic run through the real store: ``ArtifactStore.initialize`` writes
experiment.json and plan.jsonl, and every case is one ``AttemptWriter`` attempt with the files
``execute/case.py`` writes (requested, materialized, actual and identity JSON with a real
execution-key payload, score_rollout.pt and score_training.pt in the canonical batch layout,
comparison.json from the real verdict, token_diffs.pt, COMPLETE), plus the sealed attribution
of the run (``attribution.sealed.attribute_and_seal``). Every eighth case drifts past the
threshold (MISMATCH); the others carry small noise. Then times, best of R rounds, each command
as the user runs it (a fresh interpreter):

- verify: ``python -m pytest_logprob_drift verify RUN --json``
- report: ``python -m pytest_logprob_drift report RUN --html PAGE --json`` (a new page each
          round; the page is never overwritten)

and prints both times, their ratio, and the page size; then (unless ``--no-browser``) loads
the last page in headless Chromium at 1280 x 800 (``tests/report_browser.live_page``) and
prints its render time: from navigation start to the load event, or to the end of a forced
layout after it, whichever is later (the page's scripts, the token view's included, run before
the load event), and the time to bring every token view into the window until it is drawn.
Goals: report <= 2x verify, page <= 5 MB, render < 3 s. Exits 1 if a goal is
missed.

    .venv/bin/python benchmarks/bench_report.py [--cases 256] [--samples 100]
        [--response 1053] [--rounds 2] [--dir D] [--keep] [--no-browser]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from pytest_logprob_drift.attribution.sealed import attribute_and_seal
from pytest_logprob_drift.numerics.verdict import judge
from pytest_logprob_drift.records import canonical_json
from pytest_logprob_drift.store.attempt import execution_key
from pytest_logprob_drift.store.run import ArtifactStore
from pytest_logprob_drift.tensorio import tensor_bytes

THRESHOLD = 1e-3
PROMPT = 16
VOCAB = 32000
EXPERIMENT = "bench-report-256"
CONTRACT = {
    "digest": "0" * 64,
    "source": "ws1",
    "threshold": THRESHOLD,
    "unit": "nats",
    "version": "ws1.2026-11.v1",
    "minor_version": 1,
}
ENVIRONMENT = {
    "device": "cpu",
    "machine": "x86_64",
    "pytest_logprob_drift": "0.1.0",
    "python": "3.11",
    "runtime": "synthetic-bench",
    "torch": torch.__version__,
}
BASELINE_KNOBS: dict[str, Any] = {
    "batch.size": 8,
    "rollout.dtype": "float32",
    "training.compute_dtype": "float32",
    "logp.backend": "native",
}


def _batch(samples: int, response: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """The canonical rollout batch: prompt then response, right-padded, ragged lengths."""
    width = PROMPT + response
    lengths = response - torch.randint(0, response // 10, (samples,), generator=generator)
    lengths[0] = response
    columns = torch.arange(width).expand(samples, width)
    valid = columns < (PROMPT + lengths).view(-1, 1)
    active = valid & (columns >= PROMPT)
    token_ids = torch.randint(3, VOCAB, (samples, width), generator=generator) * valid
    logprobs = -torch.rand((samples, width), generator=generator).pow(2) * 8 * active
    return {
        "token_ids": token_ids,
        "attention_mask": valid,
        "active_mask": active,
        "logprobs": logprobs.to(torch.float32),
        "prompt_lengths": torch.full((samples,), PROMPT, dtype=torch.int64),
        "position_ids": torch.where(valid, columns, 0),
    }


def _records(knobs: dict[str, Any], changed: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "knob": knob,
            "lifecycle": "engine_construction" if knob != "batch.size" else "request",
            "requested": value,
            "materialized": value,
            "actual": value,
            "status": "applied",
            "evidence": "synthetic benchmark" + (" (changed)" if knob in changed else ""),
        }
        for knob, value in sorted(knobs.items())
    ]


def write_case(
    store: ArtifactStore,
    case_id: str,
    label: str,
    knobs: dict[str, Any],
    changed: list[str],
    rollout: dict[str, torch.Tensor],
    training: torch.Tensor,
) -> Path:
    identity = {"checkpoint": {"uri": "synthetic://bench", "digest": None}, "packing": "padded"}
    payload = {
        "case_id": case_id,
        "contract": CONTRACT,
        "environment": ENVIRONMENT,
        "identity": identity,
        "requested": knobs,
        "materialization": {},
        "scorer": {},
        "operators": [],
        "fingerprints": {},
        "runtime": "synthetic-bench",
        "version": "cross_config.execution_key.v1",
    }
    writer = store.new_attempt(case_id, execution_key(payload))
    writer.write_json(
        "requested.json",
        {"case_id": case_id, "label": label, "knobs": knobs, "changed": changed, "binding": {}},
    )
    materialized = {
        k: {"value": v, "status": "applied", "evidence": "synthetic"} for k, v in knobs.items()
    }
    writer.write_json("materialized.json", {"knobs": materialized, "operators": []})
    side = {"checkpoint_uri": "synthetic://bench", "checkpoint_digest": None, "packing": "padded"}
    writer.write_json(
        "actual.json",
        {
            "knobs": {r["knob"]: r for r in _records(knobs, changed)},
            "read_back": dict(knobs),
            "operator_provenance": [],
            "training_evidence": {"state_digest_before": "a" * 64, "state_digest_after": "a" * 64},
        },
    )
    writer.write_json(
        "identity.json",
        {"identity": identity, "rollout": side, "training": side, "execution_key_payload": payload},
    )
    consumed = {
        k: rollout[k] for k in ("token_ids", "attention_mask", "active_mask", "position_ids")
    }
    writer.write_bytes("score_rollout.pt", tensor_bytes(rollout))
    writer.write_bytes("score_training.pt", tensor_bytes({"logprobs": training, **consumed}))
    verdict = judge(training, rollout["logprobs"], rollout["active_mask"], THRESHOLD)
    writer.write_json(
        "comparison.json",
        {
            "case_id": case_id,
            "label": label,
            "contract": CONTRACT,
            **verdict.to_json(),
            "records": _records(knobs, changed),
            "numerical": {
                "outcome": verdict.outcome.value,
                "mismatches": verdict.mismatches,
                "active_tokens": verdict.active_tokens,
                "threshold": THRESHOLD,
            },
        },
    )
    writer.write_bytes(
        "token_diffs.pt",
        tensor_bytes(
            {
                "training_logprobs": training,
                "rollout_logprobs": rollout["logprobs"],
                "active_mask": rollout["active_mask"],
                "threshold": torch.tensor(THRESHOLD, dtype=torch.float64),
            }
        ),
    )
    writer.seal()
    return writer.directory


def build(base: Path, *, cases: int, samples: int, response: int) -> Path:
    store = ArtifactStore(base / "runs", EXPERIMENT)
    labels = ["baseline"] + [f"batch.size={i}" for i in range(1, cases)]
    ids = [f"{i:016x}" for i in range(cases)]
    rows = [
        {
            "case_id": case_id,
            "label": label,
            "kind": "baseline" if i == 0 else "intervention",
            "changed": [] if i == 0 else ["batch.size"],
            "lifecycle": None if i == 0 else "request",
            "requested": {"batch.size": max(i, 1)},
            "operators": [],
            "scenario_level": "S0",
            "device": "cpu",
            "executable_by": ["hf"],
            "contract_version": CONTRACT["version"],
            "threshold": CONTRACT["threshold"],
        }
        for i, (case_id, label) in enumerate(zip(ids, labels, strict=True))
    ]
    store.initialize(
        {
            "experiment_id": EXPERIMENT,
            "scenario_id": "bench-synthetic",
            "scenario": {"level": "S0", "device": "cpu"},
            "contract": CONTRACT,
            "strategy": "one_at_a_time",
            "strict_fallback": False,
            "identity": {},
        },
        rows,
    )
    generator = torch.Generator().manual_seed(20261129)
    rollout = _batch(samples, response, generator)
    active = rollout["active_mask"]
    directories = []
    for i, (case_id, label) in enumerate(zip(ids, labels, strict=True)):
        scale = 5e-3 if i % 8 == 7 else 2e-5 * (1 + i % 5)
        noise = torch.randn(active.shape, generator=generator) * scale
        training = ((rollout["logprobs"] + noise) * active).to(torch.float32)
        knobs = {**BASELINE_KNOBS, **({} if i == 0 else {"batch.size": i})}
        directories.append(
            write_case(
                store, case_id, label, knobs, [] if i == 0 else ["batch.size"], rollout, training
            )
        )
    attribute_and_seal(store.directory, EXPERIMENT, directories[0], [], directories[1:])
    return store.directory


def timed(*args: str) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_logprob_drift", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return elapsed, json.loads(proc.stdout)


RENDER = """
(() => {
  document.body.offsetHeight;  // force layout
  const nav = performance.getEntriesByType("navigation")[0];
  return {load_ms: nav.loadEventEnd, layout_ms: performance.now(),
          tokens: document.querySelectorAll("div.tokens .tk").length};
})()
"""


def render_seconds(page: Path) -> tuple[float, float, int]:
    """The page's render time in headless Chromium at 1280 x 800; then the time to bring every
    per-sample token view into the window in turn until each is drawn (each is drawn when it
    comes near the window, so this is spread over a reader's scrolling), and the tokens drawn."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from report_browser import live_page

    with live_page(page, width=1280, height=800) as live:
        timing = live.evaluate(RENDER)
        start = time.perf_counter()
        live.draw_tokens()
        drawn = time.perf_counter() - start
        tokens = int(live.evaluate("document.querySelectorAll('div.tokens .tk').length"))
        errors = live.console_errors()
    if errors:
        raise SystemExit(f"console errors on the page: {errors[:3]}")
    return max(timing["load_ms"], timing["layout_ms"]) / 1000, drawn, tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=256)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--response", type=int, default=1053)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the run and the pages")
    parser.add_argument("--no-browser", action="store_true", help="skip the render time")
    args = parser.parse_args()
    shm = Path("/dev/shm")
    base = args.dir or Path(
        tempfile.mkdtemp(prefix="bench-report-", dir=shm if shm.is_dir() else None)
    )
    try:
        start = time.perf_counter()
        run_dir = build(base, cases=args.cases, samples=args.samples, response=args.response)
        sizes = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file())
        active = int(
            _batch(args.samples, args.response, torch.Generator().manual_seed(20261129))[
                "active_mask"
            ].sum()
        )
        print(
            f"run: {args.cases} cases x {active} active tokens, {sizes / 1e9:.2f} GB sealed, "
            f"built in {time.perf_counter() - start:.0f} s ({run_dir})"
        )
        best_verify = best_report = float("inf")
        page_size = 0
        for r in range(args.rounds):
            seconds, document = timed("verify", str(run_dir), "--json")
            assert document["invalid"] == 0, document
            best_verify = min(best_verify, seconds)
            page = base / f"report-{r}.html"
            seconds, document = timed("report", str(run_dir), "--html", str(page), "--json")
            assert len(document["cases"]) == args.cases
            best_report = min(best_report, seconds)
            page_size = page.stat().st_size
            print(f"round {r + 1}: verify {best_verify:.2f} s, report {seconds:.2f} s")
        ratio = best_report / best_verify
        render, drawn, tokens = (0.0, 0.0, 0) if args.no_browser else render_seconds(page)
        print(
            f"verify {best_verify:.2f} s   report {best_report:.2f} s   ratio {ratio:.2f} "
            f"(goal <= 2)   page {page_size / 1e6:.2f} MB (goal <= 5)   render "
            + (
                "skipped"
                if args.no_browser
                else f"{render:.2f} s (goal < 3); every token view drawn in {drawn:.2f} s more "
                f"({tokens} tokens)"
            )
        )
        print(
            canonical_json(
                {
                    "verify_s": best_verify,
                    "report_s": best_report,
                    "ratio": ratio,
                    "page_mb": page_size / 1e6,
                    "render_s": None if args.no_browser else render,
                    "token_views_s": None if args.no_browser else drawn,
                }
            )
        )
        return 0 if ratio <= 2.0 and page_size <= 5e6 and render < 3.0 else 1
    finally:
        if args.keep:
            print(f"kept: {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
