"""Test support shared by the suite: repository paths, runners wired like the frontends, and
deliberately faulty smoke scorers.

The faults used to ship inside the smoke runtime; they are test code, so they live here as
subclasses that override the scorer's documented steps (inputs, forward, inside the read-only
guard, output).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_logprob_drift.cli import main as cli_main
from pytest_logprob_drift.execute.protocol import RuntimeAdapter, RuntimeBinding, TensorBatch
from pytest_logprob_drift.execute.runner import CaseResult, Runner
from pytest_logprob_drift.outcomes import Expectation
from pytest_logprob_drift.plan.binding import ExecutionPlan
from pytest_logprob_drift.policy import assemble
from pytest_logprob_drift.records import ScoringIdentity
from pytest_logprob_drift.registry.catalog import SemanticOperatorCatalog
from pytest_logprob_drift.runtimes.smoke.runtime import VOCAB, CpuSmokeAdapter, StatelessScorer

ROOT = Path(__file__).resolve().parents[1]
REPO = ROOT
EXPERIMENTS = ROOT / "experiments"
S0 = EXPERIMENTS / "cross_config_s0_cpu_smoke.json"
S0_HF = EXPERIMENTS / "cross_config_s0_hf_tiny.json"
DEEP = "tiny://qwen3-deep-l8-h64-v1"
DEEP_SMALL: dict[str, Any] = {
    "identity.checkpoint": {"uri": DEEP, "model_version": "tiny-qwen3-deep-l8-h64-v1"},
    "identity.prompts.token_ids": json.loads(
        (EXPERIMENTS / "cross_config_s0_hf_tiny_bf16.json").read_text()
    )["identity"]["prompts"]["token_ids"][:4],
    "identity.sampling.max_new_tokens": 8,
    "baseline.batch.size": 4,
}
"""``experiment_config`` changes of the engine tests on the deep tiny model: four prompts of
the transformers bfloat16 experiment, eight new tokens, one batch."""
S1 = EXPERIMENTS / "cross_config_s1_vllm_cpu_tiny.json"
S2 = EXPERIMENTS / "cross_config_s2_vllm_tp_vs_fsdp.json"
S3 = EXPERIMENTS / "cross_config_s3_qwen3_8b_tp4_cp4_bf16.json"
OFFSET_LABEL = "logp.backend=smoke_only.logp_offset"
OFFSET_EXPECT = f"{OFFSET_LABEL}=MISMATCH"
ATTEMPT_FILES = frozenset(
    {
        "requested.json",
        "materialized.json",
        "actual.json",
        "identity.json",
        "score_rollout.pt",
        "score_training.pt",
        "comparison.json",
        "token_diffs.pt",
        "COMPLETE",
    }
)
"""Every file of an attempt that scored both sides, COMPLETE included."""


def skip_unless_installed(distribution: str) -> None:
    """Skip the calling test module when ``distribution`` is not installed, found without
    importing it (``pytest.importorskip`` imports: vLLM's import takes seconds, and the fast
    loop's collection imports the slow modules it then deselects)."""
    if importlib.util.find_spec(distribution) is None:
        pytest.skip(f"{distribution} is not installed", allow_module_level=True)


def make_runner(
    plan: ExecutionPlan,
    *,
    runtime: str,
    artifacts: Path,
    allow_smoke: bool = False,
    adapter: RuntimeAdapter | None = None,
    expectations: Sequence[Expectation] = (),
    catalog: SemanticOperatorCatalog | None = None,
    baseline_repeats: int = 1,
) -> Runner:
    """A runner wired the way the CLI wires it (``policy.assemble``)."""
    catalogs = assemble()
    return Runner(
        plan,
        runtime=runtime,
        runtimes=catalogs.runtimes,
        catalog=catalog if catalog is not None else catalogs.operators,
        artifacts=artifacts,
        allow_test_only=allow_smoke,
        adapter=adapter,
        expectations=expectations,
        baseline_repeats=baseline_repeats,
    )


def run_by_label(plan: ExecutionPlan, **wiring: Any) -> dict[str, CaseResult]:
    """Execute every case of ``plan`` with ``make_runner(plan, **wiring)``; results by label."""
    with make_runner(plan, **wiring) as runner:
        return {r.label: r for r in runner.run()}


FAULTS = (
    "mutate_parameter",
    "mutate_buffer",
    "leave_train_mode",
    "use_kv_cache",
    "alter_tokens",
    "nan_scores",
    "integer_scores",
    "drop_active",
)


class FaultyScorer(StatelessScorer):
    """The smoke scorer with one deliberate defect."""

    def __init__(self, binding: RuntimeBinding, fault: str) -> None:
        super().__init__(binding)
        self.fault = fault

    def inputs(self, rollout: TensorBatch) -> dict[str, torch.Tensor]:
        consumed = super().inputs(rollout)
        if self.fault == "alter_tokens":
            consumed["token_ids"][0, -1] = (consumed["token_ids"][0, -1] + 1) % VOCAB
        if self.fault == "drop_active":
            consumed["active_mask"] = torch.zeros_like(consumed["active_mask"])
        return consumed

    def forward(
        self, params: Mapping[str, torch.Tensor], token_ids: torch.Tensor, attention: torch.Tensor
    ) -> torch.Tensor:
        if self.fault != "use_kv_cache":
            return super().forward(params, token_ids, attention)
        logits: torch.Tensor = torch.func.functional_call(
            self.model, dict(params), (token_ids, attention), {"use_cache": True}
        )
        return logits

    def inside_guard(self) -> None:
        with torch.no_grad():
            if self.fault == "mutate_parameter":
                self.model.head.add_(1e-3)
            elif self.fault == "mutate_buffer":
                self.model.scale.mul_(1.0001)
        if self.fault == "leave_train_mode":
            self.model.train()

    def output(self, logprobs: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        if self.fault == "nan_scores":
            logprobs[active] = float("nan")
        if self.fault == "integer_scores":
            return logprobs.round().to(torch.int64)
        return logprobs


class FaultyCpuSmokeAdapter(CpuSmokeAdapter):
    """The smoke runtime with a faulty scorer; a different scorer, so a different environment
    (its attempts never stand in for clean ones)."""

    def __init__(self, fault: str) -> None:
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        self.fault = fault

    def build_training(self, binding: RuntimeBinding, identity: ScoringIdentity) -> StatelessScorer:
        self._check_identity(identity)
        return FaultyScorer(binding, self.fault)

    def environment(self, identity: ScoringIdentity) -> Mapping[str, Any]:
        return {**super().environment(identity), "scorer_fault": self.fault}


def cli(
    *args: str | Path, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> tuple[int, str, str]:
    """``logprob-drift ARGS`` in this process: exit code, stdout, stderr (``env`` is added to
    the environment for the call and taken out again; ``cwd``: the working directory for the
    call). What argparse writes to ``sys.stdout``/``sys.stderr`` is captured too, and its
    ``SystemExit`` gives the exit code, as the process's would."""
    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    os.environ.update(env or {})
    before = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli_main([str(a) for a in args], out=out, err=err)
            except SystemExit as exc:
                if exc.code is None or isinstance(exc.code, int):
                    code = exc.code or 0
                else:
                    print(exc.code, file=err)
                    code = 1
    finally:
        os.chdir(before)
        os.environ.clear()
        os.environ.update(saved)
    return code, out.getvalue(), err.getvalue()


def cli_completed(
    *args: str | Path, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``cli(*args, env=env, cwd=cwd)`` shaped like a finished process (``returncode``,
    ``stdout``, ``stderr``)."""
    code, out, err = cli(*args, env=env, cwd=cwd)
    return subprocess.CompletedProcess([str(a) for a in args], code, out, err)


def run_s0(
    artifacts: Path, *extra: str, env: Mapping[str, str] | None = None
) -> tuple[int, str, str]:
    """``run`` of the S0 smoke experiment (the offset case expected to MISMATCH), ``--json``."""
    return cli(
        "run",
        S0,
        "--runtime",
        "cpu-smoke",
        "--allow-smoke-operators",
        "--expect",
        OFFSET_EXPECT,
        "--artifacts",
        artifacts,
        "--json",
        *extra,
        env=env,
    )


def pytest_drift(
    workdir: Path, *args: str | Path, timeout: float = 1500
) -> subprocess.CompletedProcess[str]:
    """A real ``pytest`` process in ``workdir`` (its own rootdir, no cache), quiet with the
    short summary of every item, given ``args`` (the ``--drift-*`` options)."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA"]
    return subprocess.run(
        [*command, "--rootdir", str(workdir), *map(str, args)],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def plugin_run(workdir: Path, config: Path, *options: str | Path, runtime: str) -> dict[str, Any]:
    """``config`` copied into ``workdir`` and executed by the plugin in a real pytest process
    (``--drift-runtime RUNTIME``, artifacts under ``workdir/runs``, then ``options``): the
    process, each case's sealed comparison and attempt directory by label, and the run
    directory."""
    copy = workdir / config.name
    shutil.copy(config, copy)
    artifacts = workdir / "runs"
    proc = pytest_drift(
        workdir,
        "--drift-config",
        copy,
        "--drift-runtime",
        runtime,
        "--drift-artifacts",
        artifacts,
        *options,
    )
    run_dir = artifacts / json.loads(config.read_text())["experiment_id"]
    cases: dict[str, dict[str, Any]] = {}
    for path in (run_dir / "cases").glob("*/*/comparison.json"):
        document = json.loads(path.read_text())
        cases[document["label"]] = {"comparison": document, "attempt": path.parent}
    return {"proc": proc, "cases": cases, "run_dir": run_dir}


def plan_row(case_id: str, **changes: Any) -> dict[str, Any]:
    """A ``plan.jsonl`` row of the shape ``plan.binding.case_row`` writes (every member a
    ``store.documents.PlanRow`` declares), for tests of the store that need no real plan."""
    row: dict[str, Any] = {
        "case_id": case_id,
        "label": case_id,
        "kind": "intervention",
        "changed": [],
        "lifecycle": None,
        "requested": {},
        "operators": [],
        "scenario_level": "S0",
        "device": "cpu",
        "executable_by": [],
        "contract_version": "ws1.2026-11.v1",
        "threshold": 0.001,
    }
    row.update(changes)
    return row


def experiment_document(experiment_id: str) -> dict[str, Any]:
    """An ``experiment.json`` with every member ``store.documents.ExperimentDocument``
    requires (verify decodes it as the report does), for tests of the store that need no real
    experiment."""
    return {
        "experiment_id": experiment_id,
        "scenario_id": "test",
        "scenario": {"level": "S0"},
        "contract": {},
        "strategy": "one_at_a_time",
        "strict_fallback": True,
        "identity": {},
    }


def experiment_config(
    directory: Path,
    source: str | Path,
    changes: Mapping[str, Any],
    *,
    file_name: str | None = None,
) -> Path:
    """A test's config: the shipped experiment ``source`` (a path, or a file name under
    ``experiments/``) with ``changes`` applied, each keyed by its dotted JSON path
    (``"baseline.batch.size"``, ``"identity.prompts.token_ids"``; a missing last member is
    added), written to ``directory / file_name`` (default: ``<experiment_id>.json``)."""
    path = Path(source)
    document: dict[str, Any] = json.loads(
        (path if path.is_absolute() else EXPERIMENTS / path).read_text()
    )
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        holder = document
        for member in parents:
            holder = holder[member]
        holder[last] = value
    target = directory / (file_name or f"{document['experiment_id']}.json")
    target.write_text(json.dumps(document))
    return target


def copy_of_s0(sealed_s0: Path, directory: Path) -> Path:
    """A writable copy, at ``directory / "runs"``, of the shared S0 artifacts root (the
    ``sealed_s0`` fixture, never written to): the root that holds ``s0-cpu-smoke/``."""
    target = directory / "runs"
    shutil.copytree(sealed_s0, target)
    return target
