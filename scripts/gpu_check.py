"""One command that proves and measures the GPU path on a machine with one NVIDIA GPU.

Runs from the source tree (the repository root goes first on ``sys.path``; nothing is
installed, no package registry is needed) with what a CUDA image already has: Python, a CUDA
build of torch, transformers, tokenizers, safetensors, numpy. It never imports vLLM itself
(its vLLM section runs the CLI in a process of its own where vLLM's CUDA build is
installed). Sections, cheapest first, each under the kit's own deadline (``--deadline-s``,
default 300 s); a section the deadline does not reach is recorded ``not_run``, never
dropped, and a section that fails records its error and the kit goes on:

- ``environment``: device, driver, versions;
- ``selected_logprob``: each backend (``native``: log-softmax in the logits' dtype;
  ``naive_float32``; the operator catalog's ``reference`` and ``chunked``) on bf16 logits
  ``[N, V]`` on the device, against a float64 reference (max error in float32 ulps), timed
  with ``torch.cuda.synchronize`` (best of ``--repeats`` after a warm-up) against one
  ``torch.logsumexp`` over the same bf16 logits and against the bandwidth floor (bytes read /
  a measured device-to-device copy's rate), with the peak extra memory
  (``torch.cuda.max_memory_allocated`` on cuda, the resident-set high-water mark on cpu);
- ``full_vocabulary``: the full-vocabulary reductions (``numerics.full_vocabulary``) over two
  bf16 ``[N, V]`` sides, timed and measured the same way, with their KL against float64;
- ``experiment``: ``experiments/cross_config_s0_hf_cuda_bf16.json`` through the CLI
  (``logprob-drift run --runtime hf --baseline-repeats 3 --json``): verdicts, the
  attribution (which knob moved which side, the baseline repeats' noise floor) and the
  diagnostics the results carry;
- ``vllm``: where vLLM's CUDA build is installed (read from the installed distribution,
  without importing it here), the shipped S2 experiment (``cross_config_s2_vllm_tp_vs_fsdp``)
  on the tiny model through the CLI (``run --runtime vllm-hf --json``), its baseline fitted
  to the visible GPUs and the cases that need more GPUs than the machine shows skipped with
  their need; the verdicts and every attempt's read-back (the model runner, the attention
  implementation per layer, compilation and CUDA-graph modes, ...) recorded. Elsewhere
  ``not_run`` with the reason (``--device cpu``, or no CUDA build of vLLM): not a failure.

Usage:
    python scripts/gpu_check.py                       # cuda, N=4096, V=151,936
    python scripts/gpu_check.py --device cpu --quick  # the CI dry run: tiny shapes, same keys

Writes the JSON summary to ``--out`` (default ``gpu_check_summary.json``) and prints it.
Exit code 0 when every section is ``ok`` (or ``not_run`` because it cannot apply on this
machine: the vLLM section without vLLM's CUDA build), else 1.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SECTIONS = ("environment", "selected_logprob", "full_vocabulary", "experiment", "vllm")
EXPERIMENT = REPO / "experiments" / "cross_config_s0_hf_cuda_bf16.json"
VLLM_EXPERIMENT = REPO / "experiments" / "cross_config_s2_vllm_tp_vs_fsdp.json"
VLLM_CHECKPOINT = "tiny://qwen3-h64-v1"
VLLM_PROMPTS = [[300, 417, 529, 640], [301, 700, 7], [455, 556, 657, 758, 859, 960], [333, 444]]
"""Token ids of the tiny model's vocabulary (the S2 experiment's own are Qwen3-1.7B's)."""
BASELINE_REPEATS = 3
FULL_SHAPE = (4096, 151_936)
QUICK_SHAPE = (64, 4096)
LOGIT_SCALE = 3.0
SECTION_KEYS: dict[str, tuple[str, ...]] = {
    "environment": ("device", "device_name", "driver", "versions", "vllm_imported"),
    "selected_logprob": (
        "tokens",
        "vocab",
        "dtype",
        "copy_bandwidth_gb_s",
        "logsumexp_s",
        "floor_s",
        "backends",
    ),
    "full_vocabulary": (
        "tokens",
        "vocab",
        "dtype",
        "seconds",
        "x_logsumexp",
        "x_floor",
        "peak_extra_mib",
        "max_kl_error",
    ),
    "experiment": (
        "config",
        "device",
        "baseline_repeats",
        "exit_code",
        "verdicts",
        "noise_floor",
        "moved",
        "attribution",
        "diagnostics",
    ),
    "vllm": (
        "config",
        "build",
        "gpus",
        "cases",
        "skipped",
        "exit_code",
        "verdicts",
        "read_back",
    ),
}
BACKEND_KEYS = ("max_error_ulps", "seconds", "x_logsumexp", "x_floor", "peak_extra_mib")
"""What each ``selected_logprob`` backend row carries (the dry-run test checks them)."""


# --------------------------------------------------------------------------- deadline


class Deadline:
    """The kit's own clock: every section asks it before starting."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def run_section(
    name: str, summary: dict[str, Any], deadline: Deadline, need_s: float, body: Callable[[], Any]
) -> None:
    """Run one section into ``summary["sections"][name]``: ``ok`` with its fields, ``failed``
    with the error, or ``not_run`` when fewer than ``need_s`` seconds are left."""
    if deadline.left() < need_s:
        summary["sections"][name] = {
            "status": "not_run",
            "reason": f"deadline: {max(0.0, deadline.left()):.0f} s left, this section needs "
            f"about {need_s:.0f} s",
        }
        return
    began = time.monotonic()
    try:
        fields = body()
        summary["sections"][name] = {"status": "ok", **fields}
    except Exception as exc:  # the kit records a failure and goes on to the next section
        summary["sections"][name] = {
            "status": "failed",
            "error": f"{type(exc).__name__}: {exc}",
            "traceback_tail": traceback.format_exc().splitlines()[-6:],
        }
    summary["sections"][name]["seconds_spent"] = round(time.monotonic() - began, 3)


# --------------------------------------------------------------------------- measuring


# What the CLI imports beyond a CUDA image's own packages (pyproject's ``dependencies``).
PROJECT_DEPENDENCIES = ("msgspec", "pytest")


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rss_kib(key: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


class PeakMemory:
    """Peak memory above the start, on the device: ``torch.cuda.max_memory_allocated`` on
    cuda, the resident-set high-water mark (``/proc``, reset through ``clear_refs``) on cpu."""

    def __init__(self, device: Any) -> None:
        self.device = device

    def __enter__(self) -> PeakMemory:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            try:
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                pass
            self.base = _rss_kib("VmRSS") * 1024
        self.peak = 0
        return self

    def __exit__(self, *exc: object) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            top = torch.cuda.max_memory_allocated(self.device)
        else:
            top = _rss_kib("VmHWM") * 1024
        self.peak = max(0, top - self.base)

    @property
    def mib(self) -> float:
        return round(self.peak / (1 << 20), 3)


def timed(fn: Callable[[], Any], device: Any, repeats: int) -> tuple[float, Any]:
    """Best wall time of ``repeats`` synchronized calls after one warm-up, and the last
    result."""
    result = fn()
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        result = None
        _sync(device)
        start = time.perf_counter()
        result = fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best, result


def make_logits(tokens: int, vocab: int, device: Any, seed: int) -> tuple[Any, Any]:
    """Deterministic bf16 logits ``LOGIT_SCALE * N(0, 1)`` ``[tokens, vocab]`` and token ids,
    generated on the device (no host copy of the large tensor)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    logits = torch.empty((tokens, vocab), dtype=torch.bfloat16, device=device)
    for r0 in range(0, tokens, 256):
        r1 = min(r0 + 256, tokens)
        block = torch.randn((r1 - r0, vocab), generator=gen, device=device, dtype=torch.float32)
        logits[r0:r1] = block.mul_(LOGIT_SCALE)
    ids = torch.randint(0, vocab, (tokens,), generator=gen, device=device)
    return logits, ids


def float64_selected(logits: Any, ids: Any) -> Any:
    """The float64 selected-token logprob of the (already rounded) logits, in row blocks."""
    import torch

    out = torch.empty(ids.shape, dtype=torch.float64, device=logits.device)
    for r0 in range(0, logits.shape[0], 128):
        block = torch.log_softmax(logits[r0 : r0 + 128].double(), dim=-1)
        out[r0 : r0 + 128] = block.gather(-1, ids[r0 : r0 + 128, None])[:, 0]
    return out


def max_ulps(values: Any, reference: Any) -> float:
    """Max |value - reference| in units of the float32 spacing at the reference."""
    import torch

    ref32 = reference.float()
    spacing = torch.nextafter(ref32.abs(), torch.full_like(ref32, float("inf"))) - ref32.abs()
    return float(((values.double() - reference).abs() / spacing.double()).max())


def copy_bandwidth(logits: Any, repeats: int) -> float:
    """Bytes per second a device-to-device copy of ``logits`` moves (read + written)."""
    import torch

    dst = torch.empty_like(logits)
    seconds, _ = timed(lambda: dst.copy_(logits), logits.device, repeats)
    return 2 * logits.numel() * logits.element_size() / seconds


def selected_logprob_backends() -> dict[str, Callable[[Any, Any], Any]]:
    """The backends measured: the runtimes' native and reference functions and the operator
    catalog's ``reference`` and ``chunked`` (loaded from ``operators/`` in the tree)."""
    import importlib.util

    import torch

    name = "logprob_drift_operators"
    if name not in sys.modules and importlib.util.find_spec(name) is None:
        folder = REPO / "operators"
        spec = importlib.util.spec_from_file_location(
            name, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    from logprob_drift_operators.selected_logprob import (  # type: ignore[import-not-found]
        chunked_selected_logprob,
        reference_selected_logprob,
    )

    def native(logits: Any, ids: Any) -> Any:
        return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, None])[:, 0].float()

    def naive_float32(logits: Any, ids: Any) -> Any:
        return torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, None])[:, 0]

    return {
        "native": native,
        "naive_float32": naive_float32,
        "reference": reference_selected_logprob,
        "chunked": chunked_selected_logprob,
    }


# --------------------------------------------------------------------------- sections


def environment(device_name: str) -> dict[str, Any]:
    import torch

    driver = "none"
    name = platform.processor() or platform.machine()
    if device_name == "cuda":
        name = torch.cuda.get_device_name(0)
        try:
            done = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            )
            driver = done.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError) as exc:
            driver = f"unknown ({type(exc).__name__})"
    return {
        "device": device_name,
        "device_name": name,
        "driver": driver,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if device_name == "cuda" else None,
            "transformers": _version("transformers"),
            "tokenizers": _version("tokenizers"),
            "safetensors": _version("safetensors"),
            "numpy": _version("numpy"),
            **{name: _version(name) for name in PROJECT_DEPENDENCIES},
        },
        "vllm_imported": "vllm" in sys.modules,
    }


def selected_logprob(device_name: str, shape: tuple[int, int], repeats: int) -> dict[str, Any]:
    import torch

    device = torch.device(device_name)
    tokens, vocab = shape
    logits, ids = make_logits(tokens, vocab, device, seed=0)
    reference = float64_selected(logits, ids)
    bandwidth = copy_bandwidth(logits, repeats)
    bytes_read = logits.numel() * logits.element_size()
    floor_s = bytes_read / bandwidth
    lse_s, _ = timed(lambda: torch.logsumexp(logits, dim=-1), device, repeats)
    rows: dict[str, Any] = {}
    for name, fn in selected_logprob_backends().items():
        with torch.no_grad():
            fn(logits, ids)  # warm-up outside the memory window
            _sync(device)
            with PeakMemory(device) as peak:
                seconds, values = timed(lambda fn=fn: fn(logits, ids), device, repeats)
        rows[name] = {
            "max_error_ulps": max_ulps(values, reference),
            "seconds": seconds,
            "x_logsumexp": seconds / lse_s,
            "x_floor": seconds / floor_s,
            "peak_extra_mib": peak.mib,
        }
        del values
    return {
        "tokens": tokens,
        "vocab": vocab,
        "dtype": "bfloat16",
        "copy_bandwidth_gb_s": bandwidth / 1e9,
        "logsumexp_s": lse_s,
        "floor_s": floor_s,
        "backends": rows,
    }


def full_vocabulary(device_name: str, shape: tuple[int, int], repeats: int) -> dict[str, Any]:
    import torch

    from pytest_logprob_drift.numerics.full_vocabulary import full_vocab_divergence

    device = torch.device(device_name)
    tokens, vocab = shape
    rollout, _ = make_logits(tokens, vocab, device, seed=1)
    training, _ = make_logits(tokens, vocab, device, seed=2)
    training = (rollout.float() * 0.9 + training.float() * 0.1).to(torch.bfloat16)
    bandwidth = copy_bandwidth(rollout, repeats)
    floor_s = 2 * rollout.numel() * rollout.element_size() / bandwidth  # both sides read
    lse_s, _ = timed(
        lambda: (torch.logsumexp(rollout, dim=-1), torch.logsumexp(training, dim=-1)),
        device,
        repeats,
    )
    full_vocab_divergence(rollout, training)
    _sync(device)
    with PeakMemory(device) as peak:
        seconds, result = timed(lambda: full_vocab_divergence(rollout, training), device, repeats)
    rows = min(tokens, 64)
    lp = torch.log_softmax(rollout[:rows].double(), dim=-1)
    lq = torch.log_softmax(training[:rows].double(), dim=-1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    error = float((result.kl_rollout_training[:rows] - kl).abs().max())
    return {
        "tokens": tokens,
        "vocab": vocab,
        "dtype": "bfloat16",
        "seconds": seconds,
        "x_logsumexp": seconds / lse_s,
        "x_floor": seconds / floor_s,
        "peak_extra_mib": peak.mib,
        "max_kl_error": error,
        "kl_rows_checked": rows,
    }


def _experiment_config(device_name: str, quick: bool, folder: Path) -> Path:
    """The shipped CUDA experiment, on ``device_name`` (``--device cpu``: the same cases on
    cpu); ``--quick`` keeps 4 prompts and 4 new tokens."""
    document = json.loads(EXPERIMENT.read_text())
    document["scenario"]["device"] = device_name
    if quick:
        document["identity"]["prompts"]["token_ids"] = document["identity"]["prompts"]["token_ids"][
            :4
        ]
        document["identity"]["sampling"]["max_new_tokens"] = 4
    path = folder / f"experiment-{device_name}.json"
    path.write_text(json.dumps(document, indent=2))
    return path


def _run_json(arguments: list[str], deadline: Deadline, what: str) -> tuple[int, dict[str, Any]]:
    """``logprob-drift run ARGUMENTS --json`` in a child within the kit's deadline: its exit
    code and JSON document (TimeoutError past the deadline, RuntimeError without a document,
    naming ``what`` ran)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "pytest_logprob_drift", "run", "--json", *arguments]
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=max(1.0, deadline.left() - 5.0),
            env=env,
            cwd=REPO,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise TimeoutError(f"{what} ran past the kit's deadline ({exc.timeout:.0f} s)") from None
    try:
        document = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(
            f"logprob-drift run exited {done.returncode} without a JSON document: "
            + " | ".join(done.stderr.strip().splitlines()[-3:])
        ) from None
    return done.returncode, document


def experiment(device_name: str, quick: bool, deadline: Deadline, folder: Path) -> dict[str, Any]:
    missing = [name for name in PROJECT_DEPENDENCIES if _version(name) == "absent"]
    if missing:
        raise RuntimeError(
            f"the project's own dependencies are not installed here: {', '.join(missing)}; "
            "install their wheels without a registry (pip install --no-index --target DIR "
            "WHEEL..., then PYTHONPATH=DIR), docs/GPU.md"
        )
    config = _experiment_config(device_name, quick, folder)
    returncode, document = _run_json(
        [
            "--runtime",
            "hf",
            "--baseline-repeats",
            str(BASELINE_REPEATS),
            "--artifacts",
            str(folder / "artifacts"),
            str(config),
        ],
        deadline,
        "the experiment",
    )
    verdicts = [
        {
            key: r.get(key)
            for key in ("label", "outcome", "active_tokens", "mismatches", "max_abs_diff", "reason")
        }
        for r in document["results"]
    ]
    diagnostics = {
        r["label"]: {k: r[k] for k in ("full_vocabulary", "semantic_offset") if k in r}
        for r in document["results"]
    }
    attribution = document.get("attribution") or {}
    return {
        "noise_floor": attribution.get("noise_floor"),
        "moved": {c["label"]: c.get("classification") for c in attribution.get("cases", [])},
        "config": str(EXPERIMENT.relative_to(REPO)),
        "device": device_name,
        "baseline_repeats": BASELINE_REPEATS,
        "exit_code": returncode,
        "verdicts": verdicts,
        "attribution": document.get("attribution"),
        "diagnostics": diagnostics,
        "failures": document.get("failures"),
        "engine_constructions": document.get("engine_constructions"),
    }


def vllm_applicable(device_name: str) -> str | None:
    """Why the vLLM section cannot run here (None when it can): it needs cuda and vLLM's
    CUDA build (read from the installed distribution; vLLM is not imported here)."""
    if device_name != "cuda":
        return "the vLLM section runs on cuda only (vLLM's CUDA build); --device is cpu"
    from pytest_logprob_drift.runtimes.machine import cuda_build

    instead = cuda_build("vllm")
    if instead is not None:
        return f"vLLM's CUDA build is not installed: {instead}"
    return None


def _vllm_config(gpus: int, quick: bool, folder: Path) -> tuple[Path, dict[str, Any]]:
    """The shipped S2 experiment on the tiny model, its baseline fitted to ``gpus`` (TP and
    FSDP of 2 where two GPUs are visible, else 1 and none), and its interventions less the
    values whose case needs more GPUs than visible (returned, with their need)."""
    from pytest_logprob_drift.execute.machine_fit import case_gpus
    from pytest_logprob_drift.runtimes import VLLM_HF

    document = json.loads(VLLM_EXPERIMENT.read_text())
    document["identity"]["checkpoint"] = {"uri": VLLM_CHECKPOINT, "model_version": "tiny"}
    document["identity"]["tokenizer"] = {"id": VLLM_CHECKPOINT, "add_special_tokens": False}
    document["identity"]["prompts"] = {"token_ids": VLLM_PROMPTS}
    document["identity"]["sampling"]["max_new_tokens"] = 4 if quick else 16
    baseline = document["baseline"]
    baseline["batch"]["size"] = 2
    # flash_attention_2 needs the flash-attn package, which a CUDA image may lack
    baseline["training"]["attention_backend"] = "sdpa"
    shipped = {f"{k}.{n}": v for k, section in baseline.items() for n, v in section.items()}
    fits_two = gpus >= 2
    baseline["rollout"]["tensor_parallel_size"] = 2 if fits_two else 1
    baseline["training"]["sharding"] = "fsdp" if fits_two else "none"
    flat = {f"{k}.{n}": v for k, section in baseline.items() for n, v in section.items()}
    kept, skipped = [], {}
    for path, value in shipped.items():  # the shipped baseline's values the fit gave up
        need = case_gpus({**flat, path: value}, VLLM_HF)
        if flat[path] != value and need > gpus:
            skipped[f"{path}={str(value).lower()}"] = f"needs {need} GPUs; {gpus} visible"
    for item in document["interventions"]:
        values = []
        for value in item["values"]:
            need = case_gpus({**flat, item["path"]: value}, VLLM_HF)
            if flat.get(item["path"]) == value:
                continue
            if need > gpus:
                skipped[f"{item['path']}={str(value).lower()}"] = (
                    f"needs {need} GPUs; {gpus} visible"
                )
            else:
                values.append(value)
        if values:
            kept.append({"path": item["path"], "values": values})
    document["interventions"] = kept
    document["experiment_id"] = "gpu-check-s2-vllm-tiny"
    path = folder / "experiment-vllm.json"
    path.write_text(json.dumps(document, indent=2))
    return path, skipped


def vllm_section(quick: bool, deadline: Deadline, folder: Path) -> dict[str, Any]:
    import torch

    gpus = int(torch.cuda.device_count())
    config, skipped = _vllm_config(gpus, quick, folder)
    artifacts = folder / "vllm-artifacts"
    returncode, document = _run_json(
        ["--runtime", "vllm-hf", "--artifacts", str(artifacts), str(config)],
        deadline,
        "the vLLM run",
    )
    verdicts = [
        {key: r.get(key) for key in ("label", "outcome", "max_abs_diff", "reason")}
        for r in document["results"]
    ]
    read_back: dict[str, Any] = {}
    for actual in sorted(artifacts.glob("*/cases/*/*/actual.json")):
        record = json.loads(actual.read_text())
        knobs = {k: v.get("actual") for k, v in (record.get("knobs") or {}).items()}
        read_back[f"{actual.parent.parent.name}/{actual.parent.name}"] = {
            "knobs": knobs,
            "read_back": record.get("read_back"),
        }
    return {
        "config": str(VLLM_EXPERIMENT.relative_to(REPO)),
        "checkpoint": VLLM_CHECKPOINT,
        "build": importlib.metadata.version("vllm"),
        "gpus": gpus,
        "cases": [v["label"] for v in verdicts],
        "skipped": skipped,
        "exit_code": returncode,
        "verdicts": verdicts,
        "read_back": read_back,
        "failures": document.get("failures"),
    }


def headline(sections: dict[str, Any]) -> dict[str, Any]:
    """The figures a closing note quotes, from the sections that ran (None where one did
    not): the GPU noise floor (the baseline repeats), which knob moved which side, and each
    operator's time against logsumexp and the bandwidth floor."""
    run = sections.get("experiment", {})
    slp = sections.get("selected_logprob", {})
    full = sections.get("full_vocabulary", {})
    return {
        "noise_floor": run.get("noise_floor"),
        "moved": run.get("moved"),
        "selected_logprob": {
            name: {k: row[k] for k in ("max_error_ulps", "x_logsumexp", "x_floor")}
            for name, row in slp.get("backends", {}).items()
        }
        or None,
        "full_vocabulary": {k: full[k] for k in ("x_logsumexp", "x_floor") if k in full} or None,
    }


# --------------------------------------------------------------------------- driver


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (the CI dry run)")
    parser.add_argument("--deadline-s", type=float, default=300.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("gpu_check_summary.json"))
    args = parser.parse_args(argv)
    deadline = Deadline(args.deadline_s)
    shape = QUICK_SHAPE if args.quick else FULL_SHAPE
    repeats = 2 if args.quick else args.repeats
    summary: dict[str, Any] = {
        "kit": "scripts/gpu_check.py",
        "started_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": args.device,
        "quick": args.quick,
        "deadline_s": args.deadline_s,
        "sections": {},
    }
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        for name in SECTIONS:
            summary["sections"][name] = {
                "status": "not_run",
                "reason": f"no CUDA device visible to torch {torch.__version__}",
            }
    else:
        # a quick (tiny) section needs a second or two; the full ones, more
        need = {"environment": 1.0, "selected_logprob": 5.0, "full_vocabulary": 5.0}
        if not args.quick:
            need.update(selected_logprob=20.0, full_vocabulary=20.0)
        run_section(
            "environment", summary, deadline, need["environment"], lambda: environment(args.device)
        )
        run_section(
            "selected_logprob",
            summary,
            deadline,
            need["selected_logprob"],
            lambda: selected_logprob(args.device, shape, repeats),
        )
        if args.device == "cuda":
            torch.cuda.empty_cache()
        run_section(
            "full_vocabulary",
            summary,
            deadline,
            need["full_vocabulary"],
            lambda: full_vocabulary(args.device, shape, repeats),
        )
        if args.device == "cuda":
            torch.cuda.empty_cache()
        with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
            run_section(
                "experiment",
                summary,
                deadline,
                30.0,
                lambda: experiment(args.device, args.quick, deadline, Path(tmp)),
            )
            why_not = vllm_applicable(args.device)
            if why_not is not None and deadline.left() >= 60.0:
                summary["sections"]["vllm"] = {
                    "status": "not_run",
                    "reason": why_not,
                    "not_applicable": True,
                }
            else:
                run_section(
                    "vllm",
                    summary,
                    deadline,
                    60.0,
                    lambda: vllm_section(args.quick, deadline, Path(tmp)),
                )
    summary["headline"] = headline(summary["sections"])
    summary["finished_utc"] = datetime.now(UTC).isoformat(timespec="seconds")
    # a section that cannot apply here (vLLM without its CUDA build) is no failure
    summary["ok"] = all(
        s["status"] == "ok" or s.get("not_applicable") is True for s in summary["sections"].values()
    )
    text = json.dumps(summary, indent=2, sort_keys=True, default=str)
    args.out.write_text(text + "\n")
    print(text)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
