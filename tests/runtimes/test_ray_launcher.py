"""The ``ray`` launcher (issue 15): FSDP ranks as Ray actors, vLLM's Ray executor where its
platform has one, engine groups side by side, faults, and nothing left behind.

The slow tests share one local Ray cluster on 127.0.0.1 with 2 CPUs (module fixture); runs
in this process join it (``ray.is_initialized``) and never shut it down. One S0-hf run starts
its own cluster in a subprocess, to show that a run shuts down what it started. Every slow
test checks /proc for what it started.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from drift_testing import cli, experiment_config

from pytest_logprob_drift.cli import build_parser
from pytest_logprob_drift.errors import UsageError
from pytest_logprob_drift.execute.launch import Launch, fits

ROOT = Path(__file__).resolve().parents[2]
S0_HF = ROOT / "experiments" / "cross_config_s0_hf_tiny.json"
S1 = ROOT / "experiments" / "cross_config_s1_vllm_cpu_tiny.json"
S0_EXPECT = (
    "--expect",
    "rollout.dtype=bfloat16=MISMATCH",
    "--expect",
    "training.compute_dtype=bfloat16=MISMATCH",
)
RAY_MARKERS = ("ray::", "raylet", "gcs_server", "ray/_private", "ray/dashboard", "ray/autoscaler")


# --------------------------------------------------------------------------- helpers


def _stat(pid: int) -> tuple[int, str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = raw[raw.rfind(")") + 2 :].split()
    return int(rest[1]), rest[0]


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            children.setdefault(st[0], []).append(int(entry))
    found, stack = [], list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def _alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[1] not in ("Z", "X")


def _ray_processes(root: int) -> set[int]:
    return {p for p in _descendants(root) if any(m in _cmdline(p) for m in RAY_MARKERS)}


def _wait_dead(pids: set[int], timeout_s: float = 20.0) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = {p for p in pids if _alive(p)}
        if not alive:
            return set()
        time.sleep(0.2)
    return {p for p in pids if _alive(p)}


def _run_watching_ray(args: list[str]) -> tuple[int, str, str, set[int]]:
    """Run ``python *args`` without RAY_ADDRESS (so it starts its own cluster); return its
    exit code, output, and every Ray process seen among its descendants while it ran."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    seen: set[int] = set()
    while proc.poll() is None:
        seen |= _ray_processes(proc.pid)
        time.sleep(0.2)
    out, err = proc.communicate()
    return proc.returncode, out, err, seen


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _ours(names: set[str]) -> set[str]:
    """The /dev/shm names Ray, torch or this project could leave (other jobs on the machine
    create their own, e.g. a vLLM engine's ``psm_*``, or other tests' scratch directories
    ``logprob-drift-test-*``, while these tests run)."""
    return {n for n in names if any(k in n for k in ("ray", "plasma", "torch"))}


def _config(tmp: Path, source: Path, name: str, **changes: Any) -> Path:
    return experiment_config(tmp, source, {"experiment_id": name, **changes})


def _attempts(run_dir: Path) -> dict[str, Path]:
    """label -> the sealed attempt directory of each case (one per case here)."""
    found: dict[str, Path] = {}
    for complete in sorted(run_dir.glob("cases/*/*/COMPLETE")):
        label = json.loads((complete.parent / "comparison.json").read_text())["label"]
        found[label] = complete.parent
    return found


def _tensors(path: Path) -> dict[str, Any]:
    import torch

    loaded: dict[str, Any] = torch.load(path, weights_only=True)
    return loaded


def _assert_same_evidence(local: Path, ray: Path) -> None:
    """Same verdicts, bitwise-identical sealed token ids and logprobs, case by case."""
    import torch

    a, b = _attempts(local), _attempts(ray)
    assert sorted(a) == sorted(b)
    for label in a:
        ca = json.loads((a[label] / "comparison.json").read_text())
        cb = json.loads((b[label] / "comparison.json").read_text())
        assert (ca["outcome"], ca["mismatches"], ca["active_tokens"]) == (
            cb["outcome"],
            cb["mismatches"],
            cb["active_tokens"],
        ), label
        ra, rb = _tensors(a[label] / "score_rollout.pt"), _tensors(b[label] / "score_rollout.pt")
        assert sorted(ra) == sorted(rb)
        for key in ra:
            assert torch.equal(ra[key], rb[key]), (label, key)
        ta = _tensors(a[label] / "score_training.pt")
        tb = _tensors(b[label] / "score_training.pt")
        assert torch.equal(ta["logprobs"], tb["logprobs"]), label
        # The execution key does not depend on the launcher (it is policy).
        assert (
            json.loads((a[label] / "COMPLETE").read_text())["execution_key"]
            == json.loads((b[label] / "COMPLETE").read_text())["execution_key"]
        )


# --------------------------------------------------------------------------- fast


def test_launcher_is_policy_on_the_command_line() -> None:
    from pytest_logprob_drift.cli.run_cmd import run_settings_of

    def launch_policy(args: argparse.Namespace) -> Launch:
        return run_settings_of(args, ["hf"]).launch

    args = build_parser().parse_args(
        ["run", "x.json", "--runtime", "hf", "--launcher", "ray", "--ray-address", "h:1"]
    )
    assert launch_policy(args) == Launch(launcher="ray", ray_address="h:1")
    args = build_parser().parse_args(["run", "x.json", "--runtime", "hf"])
    assert launch_policy(args) == Launch()
    args = build_parser().parse_args(["run", "x.json", "--runtime", "hf", "--ray-address", "h:1"])
    with pytest.raises(UsageError, match="need --launcher ray"):
        launch_policy(args)
    code, _, err = cli("run", str(S0_HF), "--runtime", "hf", "--serial")
    assert code == 2 and "need --launcher ray" in err
    with pytest.raises(UsageError, match="unknown launcher"):
        Launch(launcher="slurm")
    assert fits({"CPU": 1.0}, {"CPU": 1.0}) and not fits({"CPU": 1.5}, {"CPU": 1.0})
    assert fits({"GPU": 0.0}, {}) and not fits({"GPU": 1.0}, {})


def test_launch_address_falls_back_to_ray_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert Launch(launcher="ray").address() == "10.0.0.1:6379"
    assert Launch(launcher="ray", ray_address="h:2").address() == "h:2"
    monkeypatch.delenv("RAY_ADDRESS")
    assert Launch(launcher="ray").address() is None


@pytest.mark.process  # sys.modules of a fresh interpreter
def test_planning_collection_and_the_plugin_never_import_ray(tmp_path: Path) -> None:
    """Planning S0-hf, the parser, the launch policy and a ``--drift-launcher ray``
    collection in a fresh interpreter, reporting what it imported of ray and vllm."""
    config = tmp_path / S0_HF.name
    config.write_text(S0_HF.read_text())
    script = (
        "import sys, pytest\n"
        "import pytest_logprob_drift\n"
        f"pytest_logprob_drift.plan_file({str(config)!r})\n"
        "from pytest_logprob_drift.cli import build_parser\n"
        "from pytest_logprob_drift.execute import launch\n"
        "rc = pytest.main(['-q', '--collect-only', '-p', 'no:cacheprovider', "
        f"'--drift-config', {str(config)!r}, '--drift-launcher', 'ray', "
        f"'--rootdir', {str(tmp_path)!r}])\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'vllm'))\n"
        "print('RC', int(rc), 'BAD', bad[:5])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        check=False,
    )
    assert "RC 0 BAD []" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "6 tests collected" in proc.stdout


def test_vllm_executor_choice(tmp_path: Path) -> None:
    from pytest_logprob_drift.runtimes.vllm.engine import VllmEngineSpec, executor_backend

    def spec(tp: int, backend: str | None) -> VllmEngineSpec:
        return VllmEngineSpec(
            model_dir=str(tmp_path),
            dtype="float32",
            tensor_parallel_size=tp,
            enable_prefix_caching=False,
            enforce_eager=True,
            seed=0,
            max_model_len=64,
            distributed_executor_backend=backend,
        )

    assert executor_backend(spec(2, "ray"), "GPU")[0] == "ray"
    assert executor_backend(spec(1, "ray"), "GPU")[0] is None  # TP 1: uni, in the engine core
    assert executor_backend(spec(2, None), "GPU")[0] is None
    chosen, why = executor_backend(spec(2, "ray"), "")  # vLLM's CPU platform
    assert chosen is None and "no Ray device key" in why


def _declaring_smoke(free: float, barrier: threading.Barrier | None = None) -> Any:
    """The real cpu-smoke adapter, declaring one CPU per case's engines on a cluster of
    ``free`` CPUs (the runner's scheduling without Ray); ``barrier`` makes each engine group's
    first rollout build wait for the other group's (it breaks unless both run at once)."""
    from pytest_logprob_drift.runtimes.smoke.runtime import CpuSmokeAdapter

    class Adapter(CpuSmokeAdapter):
        def engine_resources(self, binding: Any) -> dict[str, float]:
            return {"CPU": 1.0}

        def cluster_resources(self) -> dict[str, float]:
            return {"CPU": free}

        def build_rollout(self, binding: Any, identity: Any) -> Any:
            if barrier is not None:
                barrier.wait()
            return super().build_rollout(binding, identity)

    return Adapter()


def _smoke_run(tmp: Path, adapter: Any, launch: Launch) -> tuple[list[Any], int]:
    """Results of the S0 cpu-smoke plan and the most cases in flight at once."""
    from pytest_logprob_drift import plan_file
    from pytest_logprob_drift.execute.runner import Runner
    from pytest_logprob_drift.outcomes import parse_expectation
    from pytest_logprob_drift.policy import assemble

    catalogs = assemble()
    plan = plan_file(str(ROOT / "experiments" / "cross_config_s0_cpu_smoke.json"),
                     catalog=catalogs.operators)  # fmt: skip
    lock, state = threading.Lock(), {"now": 0, "max": 0}

    def progress(index: int, total: int, ec: Any, outcome: Any) -> None:
        with lock:
            state["now"] += 1 if outcome is None else -1
            state["max"] = max(state["max"], state["now"])

    with Runner(
        plan,
        runtime="cpu-smoke",
        runtimes=catalogs.runtimes,
        catalog=catalogs.operators,
        artifacts=tmp,
        allow_test_only=True,
        adapter=adapter,
        expectations=[parse_expectation("logp.backend=smoke_only.logp_offset=MISMATCH")],
        launch=launch,
    ) as runner:
        return runner.run(progress=progress), state["max"]


def test_engine_groups_side_by_side_equal_the_serial_run(tmp_path: Path) -> None:
    """The runner's scheduling on the real smoke engines: two engine groups (the offset
    backend shares no engine with the baseline) run at once when 2 CPUs are free, one after
    the other when 1 is, and both give the serial run's results and sealed bytes."""
    serial, _ = _smoke_run(tmp_path / "serial", _declaring_smoke(2.0), Launch(launcher="ray",
                           concurrent=False))  # fmt: skip
    side, most = _smoke_run(
        tmp_path / "side",
        _declaring_smoke(2.0, threading.Barrier(2, timeout=30)),
        Launch(launcher="ray"),
    )
    queued, one = _smoke_run(tmp_path / "queued", _declaring_smoke(1.0), Launch(launcher="ray"))
    assert most == 2 and one == 1
    for results in (side, queued):
        assert [(r.label, r.outcome) for r in results] == [(r.label, r.outcome) for r in serial]
        for a, b in zip(results, serial, strict=True):
            assert a.attempt_dir is not None and b.attempt_dir is not None
            for name in ("score_rollout.pt", "score_training.pt", "token_diffs.pt"):
                assert (a.attempt_dir / name).read_bytes() == (b.attempt_dir / name).read_bytes()


# --------------------------------------------------------------------------- slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, Any]]:
    """One local Ray cluster on 127.0.0.1 with 2 CPUs for the module; afterwards nothing of it
    may be left (checked from /proc)."""
    pytest.importorskip("ray")
    import ray

    from pytest_logprob_drift.runtimes import ray_cluster

    assert not ray.is_initialized()
    shm_before = _shm()
    lease = ray_cluster.acquire(Launch(launcher="ray", ray_num_cpus=2))
    assert lease.started_here and lease.address.startswith("127.0.0.1:")
    me = os.getpid()
    seen: set[int] = set()
    try:
        yield {"address": lease.address, "seen": seen}
    finally:
        seen |= _ray_processes(me)
        lease.release()
        assert not ray.is_initialized()
        assert not _wait_dead(seen), "Ray processes left behind"
        assert not _ours(_shm() - shm_before)


@pytest.mark.slow
def test_s0_hf_ray_matches_local_and_shuts_down_its_own_cluster(tmp_path: Path) -> None:
    """S0-hf (FSDP case included) through the CLI: ``--launcher ray`` in a subprocess that
    starts (and must shut down) its own cluster, against ``--launcher local``."""
    config = _config(tmp_path, S0_HF, "s0-hf-launchers")
    local_dir, ray_dir = tmp_path / "local", tmp_path / "ray"
    code, out, err = cli(
        "run", str(config), "--runtime", "hf", "--artifacts", str(local_dir), *S0_EXPECT
    )
    assert code == 0, out + err
    command = ["-m", "pytest_logprob_drift", "run", str(config), "--runtime", "hf"]
    code, stdout, stderr, seen = _run_watching_ray(
        [*command, "--launcher", "ray", "--artifacts", str(ray_dir), *S0_EXPECT]
    )
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    assert seen, "no Ray process seen"
    assert not _wait_dead(seen), "the run left Ray processes behind"
    _assert_same_evidence(local_dir / "s0-hf-launchers", ray_dir / "s0-hf-launchers")
    fsdp = _attempts(ray_dir / "s0-hf-launchers")["training.sharding=fsdp"]
    actual = json.loads((fsdp / "actual.json").read_text())
    evidence = actual["training_evidence"]
    assert evidence["launcher"] == "ray"
    assert actual["read_back"]["launcher"] == "ray"
    assert evidence["process_group_world_size"] == [2, 2]
    assert evidence["rank_node_ips"] == ["127.0.0.1", "127.0.0.1"]
    assert len(evidence["rank_nodes"]) == 2
    assert evidence["world_size"] == 2
    local_fsdp = _attempts(local_dir / "s0-hf-launchers")["training.sharding=fsdp"]
    local_actual = json.loads((local_fsdp / "actual.json").read_text())
    assert local_actual["training_evidence"]["launcher"] == "local"


@pytest.mark.slow
def test_s1_fsdp_and_tp2_cases_ray_match_local(cluster: dict[str, Any], tmp_path: Path) -> None:
    """S1 with TP 2 rollout and FSDP trainer in one case (the baseline, no interventions):
    vLLM's executor choice and the rank actors both run under each launcher, at the cost of
    one case per launcher."""
    pytest.importorskip("vllm")
    baseline = json.loads(S1.read_text())["baseline"]
    baseline["rollout"]["tensor_parallel_size"] = 2
    baseline["training"]["sharding"] = "fsdp"
    config = _config(tmp_path, S1, "s1-launchers", baseline=baseline, interventions=[])
    runs = {}
    for launcher in ("local", "ray"):
        artifacts = tmp_path / launcher
        code, out, err = cli(
            "run", str(config), "--runtime", "vllm-hf", "--launcher", launcher,
            "--artifacts", str(artifacts),
        )  # fmt: skip
        assert code == 0, out + err
        runs[launcher] = artifacts / "s1-launchers"
    _assert_same_evidence(runs["local"], runs["ray"])
    assert sorted(_attempts(runs["ray"])) == ["baseline"]
    case = json.loads((_attempts(runs["ray"])["baseline"] / "actual.json").read_text())
    read_back = case["read_back"]
    assert read_back["vllm.tensor_parallel_size"] == 2
    assert read_back["vllm.executor_requested"] == "ray"
    # vLLM 0.32's CPU platform has no Ray executor: read back from the live engine, said why.
    assert read_back["vllm.distributed_executor_backend"] == "mp"
    assert "no Ray device key" in read_back["vllm.executor_reason"]
    assert case["training_evidence"]["launcher"] == "ray"
    assert case["training_evidence"]["process_group_world_size"] == [2, 2]


def _actor_times() -> list[tuple[float, float]]:
    """(start, end) in seconds of every RankActor the cluster has run (the GCS actor table)."""
    from ray._private import state

    times = []
    for actor in state.actors().values():
        if actor.get("ActorClassName", "").endswith("RankActor"):
            times.append((actor["StartTime"] / 1000.0, actor["EndTime"] / 1000.0))
    return times


@pytest.mark.slow
def test_engine_groups_run_side_by_side_and_store_equals_serial(
    cluster: dict[str, Any], tmp_path: Path
) -> None:
    """Two engine groups (nothing shared: logp.backend changes both engines), each an FSDP
    group of 2 rank actors of 0.5 CPU: both fit the 2-CPU cluster at once."""
    base = json.loads(S0_HF.read_text())
    base["baseline"]["training"]["sharding"] = "fsdp"
    config = _config(
        tmp_path,
        S0_HF,
        "s0-hf-groups",
        baseline=base["baseline"],
        interventions=[{"path": "logp.backend", "values": ["rlkernel.reference_logp"]}],
    )
    before = _actor_times()
    common = ["--runtime", "hf", "--launcher", "ray", "--ray-rank-cpus", "0.5"]
    code, out, err = cli("run", str(config), *common, "--artifacts", str(tmp_path / "par"))
    assert code == 0, out + err
    concurrent = [t for t in _actor_times() if t not in before]
    code, out, err = cli(
        "run", str(config), *common, "--serial", "--artifacts", str(tmp_path / "ser")
    )
    assert code == 0, out + err
    # 2 groups x 2 ranks; the two groups' actors were alive at the same time.
    assert len(concurrent) == 4
    starts = sorted(concurrent)
    first_group_end = min(end for _, end in starts[:2])
    assert max(start for start, _ in concurrent) < first_group_end, concurrent
    par, ser = tmp_path / "par" / "s0-hf-groups", tmp_path / "ser" / "s0-hf-groups"
    _assert_same_evidence(par, ser)
    # The store is the serial run's, attempt ids and timestamps aside.
    assert (par / "plan.jsonl").read_bytes() == (ser / "plan.jsonl").read_bytes()
    assert (par / "experiment.json").read_bytes() == (ser / "experiment.json").read_bytes()
    pa, sa = _attempts(par), _attempts(ser)
    for label in pa:
        assert pa[label].parent.name == sa[label].parent.name  # same case ids
        assert sorted(p.name for p in pa[label].iterdir()) == sorted(
            p.name for p in sa[label].iterdir()
        )
        for name in ("requested.json", "materialized.json", "identity.json", "comparison.json"):
            assert (pa[label] / name).read_bytes() == (sa[label] / name).read_bytes(), name
        for name in ("score_rollout.pt", "score_training.pt", "token_diffs.pt"):
            assert (pa[label] / name).read_bytes() == (sa[label] / name).read_bytes(), name


@pytest.mark.slow
def test_killed_rank_actor_fails_the_case_and_a_rerun_resumes(
    cluster: dict[str, Any], tmp_path: Path
) -> None:
    config = _config(
        tmp_path,
        S0_HF,
        "s0-hf-kill",
        interventions=[
            {"path": "training.sharding", "values": ["fsdp"]},
            {"path": "training.attention_backend", "values": ["eager"]},
        ],
    )
    artifacts = tmp_path / "runs"
    shm_before = _shm()
    killed: list[int] = []
    actors: set[int] = set()
    stop = threading.Event()

    def kill_rank_mid_case() -> None:
        # A rank actor's process is titled ``ray::RankActor.call`` while it answers a request
        # (loading and sharding the model, or scoring): kill rank 1's with SIGKILL then.
        while not stop.is_set() and not killed:
            for pid in _descendants(os.getpid()):
                title = _cmdline(pid)
                if title.startswith("ray::RankActor"):
                    actors.add(pid)
                if title.startswith("ray::RankActor.call") and len(actors) >= 2:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_rank_mid_case, daemon=True)
    killer.start()
    try:
        code, out, err = cli(
            "run", str(config), "--runtime", "hf", "--launcher", "ray", "--artifacts",
            str(artifacts),
        )  # fmt: skip
    finally:
        stop.set()
        killer.join(10)
    assert killed, "no rank actor was seen answering a request"
    assert code == 3, out + err
    failure = [line for line in err.splitlines() if "training.sharding=fsdp failed" in line]
    assert len(failure) == 1 and "FSDP rank" in failure[0] and "Ray actor" in failure[0], err
    print(failure[0])  # shown with -s: the one line a user sees
    run_dir = artifacts / "s0-hf-kill"
    sealed = _attempts(run_dir)
    assert "training.sharding=fsdp" not in sealed  # nothing sealed for it
    assert {"baseline", "training.attention_backend=eager"} <= set(sealed)  # later cases ran
    # Nothing of the failed group is left: its actors' processes, its placement group.
    assert not _wait_dead(actors)
    from ray.util import placement_group_table

    assert all(pg["state"] == "REMOVED" for pg in placement_group_table().values())
    assert not _ours(_shm() - shm_before)
    # A rerun resumes: the two sealed cases are reused, the failed one executes now.
    code, out, err = cli(
        "run", str(config), "--runtime", "hf", "--launcher", "ray", "--artifacts",
        str(artifacts), "--json",
    )  # fmt: skip
    assert code == 0, out + err
    results = {r["label"]: r["reused"] for r in json.loads(out)["results"]}
    assert results == {
        "baseline": True,
        "training.sharding=fsdp": False,
        "training.attention_backend=eager": True,
    }


_BACKGROUND_START = """
import json, os, sys, time
import ray
from pytest_logprob_drift.execute.launch import Launch
from pytest_logprob_drift.runtimes import ray_cluster

launch = Launch(launcher="ray", ray_num_cpus=1)
ray_cluster.start_in_background(launch)
ray_cluster.start_in_background(launch)  # a second call while the first runs: nothing
if sys.argv[1] == "acquire":
    lease = ray_cluster.acquire(launch)
    print(json.dumps({"started_here": lease.started_here, "address": lease.address,
                      "initialized": ray.is_initialized()}))
    lease.release()
else:
    ray_cluster.abandon_background_start()
print(json.dumps({"initialized_after": ray.is_initialized(),
                  "keeper_left": ray_cluster._STATE.keeper is not None}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["acquire", "abandon"])
def test_a_background_start_is_acquired_or_abandoned_and_leaves_nothing(how: str) -> None:
    """The local cluster that starts in the background while engines load: ``acquire`` takes
    it (started here, bound to 127.0.0.1) and the last release shuts it down; a run that never
    needed it shuts it down at close. Either way no Ray process outlives the run."""
    pytest.importorskip("ray")
    code, out, err, seen = _run_watching_ray(["-c", _BACKGROUND_START, how])
    assert code == 0, err[-3000:]
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if how == "acquire":
        assert lines[0]["started_here"] and lines[0]["initialized"]
        assert lines[0]["address"].startswith("127.0.0.1:")
    assert lines[-1] == {"initialized_after": False, "keeper_left": False}
    assert seen, "no Ray process was started"
    assert not _wait_dead(seen), "Ray processes outlived the run"
    assert "not the main thread" not in err
