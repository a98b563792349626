"""The plugin's options: ``--drift-*`` flags, ``drift_*`` ini keys, and their validation.

Owns declaring the flags and ini keys (a flag overrides its ini value), resolving them into
one validated ``DriftOptions`` record (bad values raise ``pytest.UsageError`` naming the flag),
finding the configured experiment files, the plugin's spelling of execution-policy remedies
(``--drift-allow-smoke-operators``), and rewriting a ``-k`` expression that names a case label
(``=`` and ``,`` cannot be written in ``-k``). Knows nothing about execution.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_logprob_drift.errors import Remedy, UsageError
from pytest_logprob_drift.execute.runtime_catalog import RuntimeCatalog
from pytest_logprob_drift.outcomes import Expectation, parse_expectation
from pytest_logprob_drift.store.keys import SealKey, load_seal_key

FLAGS: Mapping[Remedy, str] = {
    Remedy.AUTHORIZE_TEST_OPERATORS: "--drift-allow-smoke-operators",
    Remedy.EXPAND_PAIRS: "--drift-pairwise",
}
"""How the plugin spells each execution-policy remedy."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DriftOptions:
    """Validated plugin options (the flag overrides the ini value)."""

    configs: tuple[Path, ...]
    runtime: str | None
    allow_smoke: bool
    artifacts: Path
    plan_only: bool
    expectations: tuple[Expectation, ...]
    pairwise: bool
    baseline_repeats: int = 1
    report: Path | None = None
    """Where the HTML report of each executed experiment goes at session end (None: none)."""
    engine_logs: bool = False
    """Show vLLM's own logs on the terminal instead of a file under the artifacts."""
    seal_key: SealKey | None = None
    """The keyed-seal key (``--drift-seal-key-file``/``--drift-seal-key-env``), if any."""
    launcher: str = "local"
    """How engines' processes start: ``local`` or ``ray`` (``--drift-launcher``)."""
    ray_address: str | None = None
    """With ``ray``: the cluster to join (``--drift-ray-address``; else RAY_ADDRESS, else a
    local one)."""


def marker_name(text: str) -> str:
    return re.sub(r"[^0-9a-zA-Z_]", "_", text)


def keyword_token(text: str) -> str:
    """``text`` in the spelling a ``-k`` expression can write: ``=`` and ``,`` (which case
    labels use and ``-k`` cannot) become ``+eq+`` and ``+comma+``."""
    return text.replace("=", "+eq+").replace(",", "+comma+")


def add_options(parser: pytest.Parser, runtime_names: Sequence[str]) -> None:
    """The ``--drift-*`` flags and their ``drift_*`` ini keys."""
    group = parser.getgroup("logprob-drift", "rollout/training logprob drift experiments")
    group.addoption(
        "--drift-config",
        action="append",
        default=None,
        metavar="PATH",
        help="experiment config; one test item per planned case (repeatable)",
    )
    group.addoption(
        "--drift-runtime",
        default=None,
        metavar="NAME",
        help=f"runtime that executes the cases: {', '.join(runtime_names)}",
    )
    group.addoption(
        "--drift-allow-smoke-operators",
        action="store_true",
        default=None,
        help="register and authorize the smoke-only selected_logprob backends",
    )
    group.addoption(
        "--drift-artifacts",
        default=None,
        metavar="DIR",
        help="artifact root (default: runs/ under the invocation directory)",
    )
    group.addoption(
        "--drift-plan-only",
        action="store_true",
        default=None,
        help="collect and plan the cases, execute nothing",
    )
    group.addoption(
        "--drift-expect",
        action="append",
        default=None,
        metavar="SELECTOR=OUTCOME",
        help="expected outcome of matching cases",
    )
    group.addoption(
        "--drift-pairwise",
        action="store_true",
        default=None,
        help="also expand the config's listed path pairs",
    )
    group.addoption(
        "--drift-baseline-repeats",
        default=None,
        metavar="N",
        help="execute each baseline N times with the same engines: the attribution's "
        "run-to-run noise floor (default 1)",
    )
    group.addoption(
        "--drift-report",
        default=None,
        metavar="PATH",
        help="at session end write the HTML report of the executed experiment there "
        "(never overwritten; with several experiments, one file each: PATH's stem + -<id>)",
    )
    group.addoption(
        "--drift-engine-logs",
        action="store_true",
        default=None,
        help="show vLLM's own logs on the terminal (default: ARTIFACTS/engine-logs/)",
    )
    group.addoption(
        "--drift-seal-key-file",
        default=None,
        metavar="PATH",
        help="keyed seals: HMAC-SHA256 with the key in this file (new attempts are sealed "
        "with it; only attempts sealed with it are reused)",
    )
    group.addoption(
        "--drift-seal-key-env",
        default=None,
        metavar="NAME",
        help="like --drift-seal-key-file, with the key in environment variable NAME",
    )
    group.addoption(
        "--drift-launcher",
        default=None,
        choices=("local", "ray"),
        help="how engines' processes start: local child processes (default) or Ray actors "
        "(extra 'ray')",
    )
    group.addoption(
        "--drift-ray-address",
        default=None,
        metavar="ADDR",
        help="with --drift-launcher ray: the cluster to join (default: RAY_ADDRESS, else a "
        "local cluster on 127.0.0.1 started and shut down by the session)",
    )
    parser.addini("drift_launcher", default="local", help="default --drift-launcher")
    parser.addini("drift_ray_address", default="", help="default --drift-ray-address")
    parser.addini("drift_seal_key_file", default="", help="default --drift-seal-key-file")
    parser.addini("drift_seal_key_env", default="", help="default --drift-seal-key-env")
    parser.addini("drift_baseline_repeats", default="1", help="default --drift-baseline-repeats")
    parser.addini("drift_report", default="", help="default --drift-report")
    parser.addini(
        "drift_engine_logs", type="bool", default=False, help="default --drift-engine-logs"
    )
    parser.addini(
        "drift_config",
        type="paths",
        default=[],
        help="experiment configs collected as drift cases when no path is given",
    )
    parser.addini("drift_runtime", default="", help="default --drift-runtime")
    parser.addini(
        "drift_allow_smoke_operators",
        type="bool",
        default=False,
        help="default --drift-allow-smoke-operators",
    )
    parser.addini("drift_artifacts", default="", help="default --drift-artifacts")
    parser.addini("drift_plan_only", type="bool", default=False, help="default --drift-plan-only")
    parser.addini("drift_expect", type="linelist", default=[], help="default --drift-expect")
    parser.addini("drift_pairwise", type="bool", default=False, help="default --drift-pairwise")


def _option(config: pytest.Config, name: str) -> Any:
    value = config.getoption(f"drift_{name}")
    return config.getini(f"drift_{name}") if value is None else value


def _config_paths(config: pytest.Config) -> tuple[list[Path], list[Path]]:
    """``(configs, configs to add to the collection arguments)``."""
    invocation = config.invocation_params.dir
    flag_configs = config.getoption("drift_config")
    if flag_configs is not None:
        configs = [invocation / p for p in flag_configs]
        sources = ["--drift-config"] * len(configs)
        added = list(configs)
    else:
        configs = [Path(p) for p in config.getini("drift_config")]
        sources = ["ini drift_config"] * len(configs)
        explicit = config.args_source is pytest.Config.ArgsSource.ARGS
        added = [] if explicit else list(configs)
    for results in config.hook.pytest_logprob_drift_configs(config=config):
        hooked = [invocation / p for p in results]
        configs.extend(hooked)
        sources.extend(["pytest_logprob_drift_configs"] * len(hooked))
        added.extend(hooked)
    for path, source in zip(configs, sources, strict=True):
        if not path.is_file():
            raise pytest.UsageError(f"{source} {path}: file not found")
    return configs, added


def resolve_options(
    config: pytest.Config, runtimes: RuntimeCatalog
) -> tuple[DriftOptions, list[Path]]:
    """The validated options, and the config files to add to the collection arguments."""
    invocation = config.invocation_params.dir
    configs, added = _config_paths(config)
    runtime = _option(config, "runtime") or None
    if runtime is not None and runtime not in runtimes:
        raise pytest.UsageError(
            f"--drift-runtime {runtime!r}: unknown runtime; one of {', '.join(runtimes.names)}"
        )
    plan_only = bool(_option(config, "plan_only"))
    if configs and runtime is None and not plan_only and not config.option.collectonly:
        raise pytest.UsageError(
            "--drift-config needs --drift-runtime NAME (or the ini key "
            "drift_runtime) to execute cases; add --drift-plan-only to "
            "only plan them"
        )
    try:
        expectations = tuple(parse_expectation(t) for t in _option(config, "expect"))
    except UsageError as exc:
        raise pytest.UsageError(f"--drift-expect {exc}") from None
    artifacts = _option(config, "artifacts") or "runs"
    launcher = str(_option(config, "launcher") or "local")
    if launcher not in ("local", "ray"):
        raise pytest.UsageError(f"drift_launcher {launcher!r}: expected 'local' or 'ray'")
    ray_address = str(_option(config, "ray_address") or "") or None
    if ray_address and launcher != "ray":
        raise pytest.UsageError("--drift-ray-address needs --drift-launcher ray")
    options = DriftOptions(
        configs=tuple(sorted({p.resolve() for p in configs})),
        runtime=runtime,
        allow_smoke=bool(_option(config, "allow_smoke_operators")),
        artifacts=(invocation / artifacts).resolve(),
        plan_only=plan_only,
        expectations=expectations,
        pairwise=bool(_option(config, "pairwise")),
        baseline_repeats=_baseline_repeats(_option(config, "baseline_repeats")),
        report=(invocation / report).resolve() if (report := _option(config, "report")) else None,
        engine_logs=bool(_option(config, "engine_logs")),
        seal_key=_seal_key(config),
        launcher=launcher,
        ray_address=ray_address,
    )
    return options, added


def _seal_key(config: pytest.Config) -> SealKey | None:
    file = config.getoption("drift_seal_key_file")
    env = config.getoption("drift_seal_key_env")
    if file is None and env is None:  # a flag overrides both ini keys
        file, env = config.getini("drift_seal_key_file"), config.getini("drift_seal_key_env")
    if file:
        file = str(config.invocation_params.dir / file)
    try:
        return load_seal_key(
            file=file or None,
            env=env or None,
            flags=("--drift-seal-key-file", "--drift-seal-key-env"),
        )
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None


def _baseline_repeats(raw: object) -> int:
    text = str(raw).strip()
    if not text.isdigit() or int(text) < 1:
        raise pytest.UsageError(f"--drift-baseline-repeats {text!r}: expected a positive integer")
    return int(text)


def named_by_args(config: pytest.Config, path: Path) -> bool:
    """Whether a collection argument already names ``path`` (maybe with ``::`` node parts)."""
    invocation = config.invocation_params.dir
    resolved = path.resolve()
    return any((invocation / arg.split("::", 1)[0]).resolve() == resolved for arg in config.args)


def keyword_for_labels(expression: str) -> str:
    """``-k`` cannot spell ``=`` or ``,`` (case labels use both); items also carry their label
    with those replaced (``keyword_token``), so an expression like ``batch.size=1`` selects."""
    return keyword_token(expression) if "=" in expression or "," in expression else expression
