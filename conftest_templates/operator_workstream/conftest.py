"""Operator workstream CI: prove a ``selected_logprob`` backend against the framework's cases.

Copy this file to the root of your CI suite (next to the module that holds your kernel), edit
the constants in the first block, and run, for example::

    pytest --drift-runtime cpu-smoke          # S0 plumbing on a synthetic model, seconds
    pytest --drift-runtime hf                 # real transformers engines (extra ``hf``)

What it does, through the ``pytest-logprob-drift`` plugin:

1. registers your backend: ``pytest_logprob_drift_operators`` returns its ``OperatorDescriptor``
   (the factory names your kernel as ``module:attr``; it is imported only when a case
   executes, so collection never imports torch);
2. points at the framework's experiments (``LOGPROB_DRIFT_EXPERIMENTS``, else the shipped S0
   experiment of the installed framework checkout) and writes, for each, a derived config
   under ``drift-configs/`` next to this file: the same identity, baseline and interventions,
   with ``$.operators.selected_logprob`` binding your backend to the ``KERNEL_SIDES`` and
   ``REFERENCE_BACKEND`` to the other side (``logp.backend`` values are removed, since the
   explicit mapping fixes the backends);
3. ``pytest_logprob_drift_configs`` hands those configs to the plugin, which collects one test
   item per planned case: PASS means your kernel agrees with the reference within the
   numerical contract's threshold for that configuration change.

Add ``drift-configs/`` and ``runs/`` (sealed evidence; ``--drift-artifacts DIR`` moves it) to
your ``.gitignore``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import pytest_logprob_drift
from pytest_logprob_drift.plan.knobs import canonical_path
from pytest_logprob_drift.registry.catalog import OperatorDescriptor

# ---- edit these ---------------------------------------------------------------------------
BACKEND_ID = "workstream.selected_logprob"
"""Your backend's id: letters, digits, '.', '_' or '-'."""
KERNEL = "workstream_kernel:selected_logprob"
"""``module:attr`` of ``(logits [..., vocab], token_ids [...]) -> float32 logprobs [...]``."""
KERNEL_VERSION = "0.1.0"
KERNEL_SIDES: tuple[str, ...] = ("training",)
"""Which side(s) run your kernel: ``("training",)``, ``("rollout",)`` or both."""
REFERENCE_BACKEND = "native"
"""Backend of the other side: the runtime's own path, or e.g. ``rlkernel.reference_logp``."""
DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "bfloat16", "float16")
EXPERIMENTS_ENV = "LOGPROB_DRIFT_EXPERIMENTS"
"""os.pathsep-separated framework experiment files; default: ``DEFAULT_EXPERIMENTS``."""
DEFAULT_EXPERIMENTS = ("cross_config_s0_cpu_smoke.json",)
"""Names under the framework checkout's ``experiments/`` folder."""
# -------------------------------------------------------------------------------------------

GENERATED_DIR = Path(__file__).resolve().parent / "drift-configs"


def kernel_build_fingerprint() -> str:
    """SHA-256 prefix of the kernel module's source, found without importing it."""
    module = KERNEL.partition(":")[0]
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise pytest.UsageError(
            f"operator workstream conftest: kernel module {module!r} "
            "is not importable from the CI suite"
        )
    return hashlib.sha256(Path(spec.origin).read_bytes()).hexdigest()[:16]


def backend_descriptor() -> OperatorDescriptor:
    return OperatorDescriptor.from_mapping(
        {
            "operation": "selected_logprob",
            "backend_id": BACKEND_ID,
            "target_tags": list(KERNEL_SIDES),
            "devices": list(DEVICES),
            "dtypes": list(DTYPES),
            "required_topology": {},
            "alignment_properties": ["log_softmax_gather"],
            "lifecycle": "engine_construction",
            "factory": KERNEL,
            "version": KERNEL_VERSION,
            "build_fingerprint": kernel_build_fingerprint(),
            "fallback_policy": "never",
        }
    )


def framework_experiments() -> list[Path]:
    listed = os.environ.get(EXPERIMENTS_ENV, "")
    if listed:
        paths = [Path(p) for p in listed.split(os.pathsep) if p]
    else:
        root = Path(pytest_logprob_drift.__file__).resolve().parent.parent / "experiments"
        paths = [root / name for name in DEFAULT_EXPERIMENTS]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise pytest.UsageError(
            f"operator workstream conftest: {', '.join(missing)} not "
            f"found; set {EXPERIMENTS_ENV} to the framework's experiment "
            "files"
        )
    return paths


def derived_config(document: dict[str, Any]) -> dict[str, Any]:
    """The framework experiment with this backend bound by an explicit operators mapping."""
    derived = json.loads(json.dumps(document))
    derived["experiment_id"] = f"{document['experiment_id']}--{BACKEND_ID}"
    derived["description"] = (
        f"{document.get('description', '')} [derived: selected_logprob "
        f"{BACKEND_ID} on {'/'.join(KERNEL_SIDES)}, {REFERENCE_BACKEND} "
        "elsewhere]"
    ).strip()
    derived.get("baseline", {}).pop("logp", None)
    derived["interventions"] = [
        i
        for i in derived.get("interventions", [])
        if canonical_path(str(i.get("path", ""))) != "logp.backend"
    ]
    pairs = derived.get("pairs", [])
    derived["pairs"] = [
        p for p in pairs if "logp.backend" not in {canonical_path(str(x)) for x in p}
    ]
    if not derived["pairs"]:
        derived.pop("pairs")
        if derived.get("strategy") == "pairwise":
            derived["strategy"] = "one_at_a_time"
    derived["operators"] = {
        "selected_logprob": {
            side: BACKEND_ID if side in KERNEL_SIDES else REFERENCE_BACKEND
            for side in ("rollout", "training")
        }
    }
    return derived


def write_if_changed(path: Path, text: str) -> None:
    """Same bytes on every xdist worker; written atomically, never half-visible."""
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def pytest_logprob_drift_operators(config: pytest.Config) -> Sequence[OperatorDescriptor]:
    return [backend_descriptor()]


def pytest_logprob_drift_configs(config: pytest.Config) -> Sequence[Path]:
    generated: list[Path] = []
    for source in framework_experiments():
        try:
            document = json.loads(source.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise pytest.UsageError(
                f"operator workstream conftest: {source}: invalid JSON: {exc}"
            ) from None
        target = GENERATED_DIR / f"{source.stem}.{BACKEND_ID}.json"
        write_if_changed(
            target, json.dumps(derived_config(document), indent=2, sort_keys=True) + "\n"
        )
        generated.append(target)
    return generated
