"""The plugin's options: ``--drift-*`` flags, ``drift_*`` ini keys, and their validation.

Owns the table of options (``OPTIONS``: name, kind, help, default), from which every
``--drift-X`` flag and its ``drift_X`` ini key are declared (a flag overrides its ini value),
resolving them into one validated ``DriftOptions`` record that holds the run's
``RunSettings`` (validated by ``execute.settings``; a refusal raises ``pytest.UsageError``
naming the flag, or the ini key when the value came from the ini file), finding the
configured experiment files, the plugin's spelling of execution-policy remedies
(``--drift-allow-smoke-operators``), and rewriting a ``-k`` expression that names a case label
(``=`` and ``,`` cannot be written in ``-k``). Knows nothing about execution.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_logprob_drift.errors import Remedy, UsageError
from pytest_logprob_drift.execute.runtime_catalog import RuntimeCatalog
from pytest_logprob_drift.execute.settings import RunSettings, Setting, run_settings

FLAGS: Mapping[Remedy, str] = {
    Remedy.AUTHORIZE_TEST_OPERATORS: "--drift-allow-smoke-operators",
    Remedy.EXPAND_PAIRS: "--drift-pairwise",
}
"""How the plugin spells each execution-policy remedy."""


class Kind(enum.Enum):
    """How an option is written: its flag's action and its ini key's type."""

    VALUE = "string"
    """``--drift-X VALUE``; ini ``drift_X = VALUE``."""
    SWITCH = "bool"
    """``--drift-X``; ini ``drift_X = true``."""
    LINES = "linelist"
    """``--drift-X VALUE`` repeatable; ini one value per line."""
    PATHS = "paths"
    """``--drift-X PATH`` repeatable; ini paths relative to the ini file."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DriftOption:
    """One row of the options table: a ``--drift-X`` flag and its ``drift_X`` ini key."""

    name: str
    """``X`` with underscores: the ini key ``drift_X``, the flag ``--drift-X`` (dashes)."""
    kind: Kind
    help: str
    """The flag's help; ``{runtimes}`` is replaced by the runtime names."""
    default: Any = None
    """The value when neither the flag nor the ini key is given (None: the kind's empty)."""
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    ini_help: str | None = None
    """The ini key's help (default: "default --drift-X")."""

    @property
    def flag(self) -> str:
        return "--drift-" + self.name.replace("_", "-")

    @property
    def ini(self) -> str:
        return f"drift_{self.name}"


OPTIONS: tuple[DriftOption, ...] = (
    DriftOption(
        name="config",
        kind=Kind.PATHS,
        metavar="PATH",
        help="experiment config; one test item per planned case (repeatable)",
        ini_help="experiment configs collected as drift cases when no path is given",
    ),
    DriftOption(
        name="runtime",
        kind=Kind.VALUE,
        metavar="NAME",
        help="runtime that executes the cases: {runtimes}",
    ),
    DriftOption(
        name="allow_smoke_operators",
        kind=Kind.SWITCH,
        help="register and authorize the smoke-only selected_logprob backends",
    ),
    DriftOption(
        name="artifacts",
        kind=Kind.VALUE,
        default="runs",
        metavar="DIR",
        help="artifact root (default: runs/ under the invocation directory)",
    ),
    DriftOption(
        name="plan_only", kind=Kind.SWITCH, help="collect and plan the cases, execute nothing"
    ),
    DriftOption(
        name="expect",
        kind=Kind.LINES,
        metavar="SELECTOR=OUTCOME",
        help="expected outcome of matching cases",
    ),
    DriftOption(
        name="pairwise", kind=Kind.SWITCH, help="also expand the config's listed path pairs"
    ),
    DriftOption(
        name="baseline_repeats",
        kind=Kind.VALUE,
        default="1",
        metavar="N",
        help="execute each baseline N times with the same engines: the attribution's "
        "run-to-run noise floor (default 1, at most 100)",
    ),
    DriftOption(
        name="replay",
        kind=Kind.SWITCH,
        help="replay every case's sampled sequences on its rollout engine (decode vs prefill "
        "diagnostics, as the config's diagnostics.replay; never a verdict)",
    ),
    DriftOption(
        name="report",
        kind=Kind.VALUE,
        metavar="PATH",
        help="at session end write the HTML report of the executed experiment there "
        "(never overwritten; with several experiments, one file each: PATH's stem + -<id>)",
    ),
    DriftOption(
        name="engine_logs",
        kind=Kind.SWITCH,
        help="show vLLM's own logs on the terminal (default: ARTIFACTS/engine-logs/)",
    ),
    DriftOption(
        name="seal_key_file",
        kind=Kind.VALUE,
        metavar="PATH",
        help="keyed seals: HMAC-SHA256 with the key in this file (new attempts are sealed "
        "with it; only attempts sealed with it are reused)",
    ),
    DriftOption(
        name="seal_key_env",
        kind=Kind.VALUE,
        metavar="NAME",
        help="like --drift-seal-key-file, with the key in environment variable NAME",
    ),
    DriftOption(
        name="launcher",
        kind=Kind.VALUE,
        default="local",
        choices=("local", "ray"),
        help="how engines' processes start: local child processes (default) or Ray actors "
        "(extra 'ray')",
    ),
    DriftOption(
        name="ray_address",
        kind=Kind.VALUE,
        metavar="ADDR",
        help="with --drift-launcher ray: the cluster to join (default: RAY_ADDRESS, else a "
        "local cluster on 127.0.0.1 started and shut down by the session)",
    ),
)
"""Every option of the plugin, in ``--help`` order."""

_BY_NAME = {option.name: option for option in OPTIONS}

SETTINGS: Mapping[Setting, str] = {
    Setting.RUNTIME: "runtime",
    Setting.EXPECT: "expect",
    Setting.BASELINE_REPEATS: "baseline_repeats",
    Setting.LAUNCHER: "launcher",
    Setting.RAY_ADDRESS: "ray_address",
    Setting.SEAL_KEY_FILE: "seal_key_file",
    Setting.SEAL_KEY_ENV: "seal_key_env",
}
"""The option that sets each run setting the plugin lets a user choose (the plugin runs
cases one at a time and starts no Ray cluster of its own size: the other settings are
fixed)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DriftOptions:
    """Validated plugin options (the flag overrides the ini value)."""

    configs: tuple[Path, ...]
    run: RunSettings
    """What the runners of this session execute with (``runtime`` None: nothing executes)."""
    plan_only: bool
    pairwise: bool
    report: Path | None = None
    """Where the HTML report of each executed experiment goes at session end (None: none)."""


def marker_name(text: str) -> str:
    return re.sub(r"[^0-9a-zA-Z_]", "_", text)


def keyword_token(text: str) -> str:
    """``text`` in the spelling a ``-k`` expression can write: ``=`` and ``,`` (which case
    labels use and ``-k`` cannot) become ``+eq+`` and ``+comma+``."""
    return text.replace("=", "+eq+").replace(",", "+comma+")


_INI_UNSET: Mapping[Kind, Any] = {
    Kind.VALUE: None,  # not "": a key set to "" (an unset CI variable) is told from no key
    Kind.SWITCH: False,
    Kind.LINES: [],
    Kind.PATHS: [],
}
"""What ``getini`` returns for a key the ini file does not set."""


def add_options(parser: pytest.Parser, runtime_names: Sequence[str]) -> None:
    """The ``--drift-*`` flags and their ``drift_*`` ini keys, from ``OPTIONS``."""
    group = parser.getgroup("logprob-drift", "rollout/training logprob drift experiments")
    for option in OPTIONS:
        flag: dict[str, Any] = {
            "default": None,  # None: not given, so the ini value applies
            "help": option.help.format(runtimes=", ".join(runtime_names)),
        }
        if option.kind is Kind.SWITCH:
            flag["action"] = "store_true"
        elif option.kind in (Kind.LINES, Kind.PATHS):
            flag["action"] = "append"
        if option.metavar is not None:
            flag["metavar"] = option.metavar
        if option.choices is not None:
            flag["choices"] = option.choices
        group.addoption(option.flag, **flag)
        parser.addini(
            option.ini,
            type=option.kind.value,
            # a string key defaults to None, so that a key set to "" is told from an unset one
            default=_INI_UNSET[option.kind],
            help=option.ini_help or f"default {option.flag}",
        )


def _option(config: pytest.Config, name: str) -> tuple[Any, str]:
    """The option's value (the flag's, else the ini key's, else the table's default) and how
    a message names it (the flag, or the ini key when the value came from the ini file)."""
    option = _BY_NAME[name]
    value = config.getoption(option.ini)
    if value is not None:
        return value, option.flag
    value = config.getini(option.ini)
    if value is None or value is False or value == []:  # the ini file does not set it
        return (value if option.default is None else option.default), option.flag
    return value, option.ini


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
        if not path.is_file():  # stat only: a FIFO or a device is never opened here
            found = "not a regular file" if path.exists() else "file not found"
            raise pytest.UsageError(f"{source} {path}: {found}")
    return configs, added


def resolve_options(
    config: pytest.Config, runtimes: RuntimeCatalog
) -> tuple[DriftOptions, list[Path]]:
    """The validated options, and the config files to add to the collection arguments."""
    invocation = config.invocation_params.dir
    configs, added = _config_paths(config)
    values = {name: _option(config, name) for name in _BY_NAME if name != "config"}
    spelling = {setting: values[name][1] for setting, name in SETTINGS.items()}
    runtime = values["runtime"][0] or None
    plan_only = bool(values["plan_only"][0])
    if configs and runtime is None and not plan_only and not config.option.collectonly:
        raise pytest.UsageError(
            "--drift-config needs --drift-runtime NAME (or the ini key "
            "drift_runtime) to execute cases; add --drift-plan-only to "
            "only plan them"
        )
    key_file, key_env = _seal_key_names(config)
    try:
        run = run_settings(
            spelling,
            runtime=runtime,
            runtimes=runtimes.names,
            artifacts=(invocation / (values["artifacts"][0] or "runs")).resolve(),
            allow_test_only=bool(values["allow_smoke_operators"][0]),
            expect=values["expect"][0],
            baseline_repeats=values["baseline_repeats"][0],
            launcher=values["launcher"][0] or "local",
            ray_address=values["ray_address"][0] or None,
            serial=True,  # items run one at a time in pytest; engine groups never overlap
            show_engine_logs=bool(values["engine_logs"][0]),
            seal_key_file=key_file,
            seal_key_env=key_env,
            replay=bool(values["replay"][0]),
        )
    except UsageError as exc:
        raise pytest.UsageError(exc.render()) from None
    report = values["report"][0]
    options = DriftOptions(
        configs=tuple(sorted({p.resolve() for p in configs})),
        run=run,
        plan_only=plan_only,
        pairwise=bool(values["pairwise"][0]),
        report=(invocation / report).resolve() if report else None,
    )
    return options, added


def _seal_key_names(config: pytest.Config) -> tuple[str | None, str | None]:
    """The key file and variable: given as flags, or else both from the ini keys (a flag
    overrides both ini keys). An empty value stays empty, which ``load_seal_key`` refuses."""
    file = config.getoption("drift_seal_key_file")
    env = config.getoption("drift_seal_key_env")
    if file is None and env is None:
        file, env = config.getini("drift_seal_key_file"), config.getini("drift_seal_key_env")
    if file:
        file = str(config.invocation_params.dir / file)
    return file, env


def named_by_args(config: pytest.Config, path: Path) -> bool:
    """Whether a collection argument already names ``path`` (maybe with ``::`` node parts)."""
    invocation = config.invocation_params.dir
    resolved = path.resolve()
    return any((invocation / arg.split("::", 1)[0]).resolve() == resolved for arg in config.args)


def keyword_for_labels(expression: str) -> str:
    """``-k`` cannot spell ``=`` or ``,`` (case labels use both); items also carry their label
    with those replaced (``keyword_token``), so an expression like ``batch.size=1`` selects."""
    return keyword_token(expression) if "=" in expression or "," in expression else expression
