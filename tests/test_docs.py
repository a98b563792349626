"""The commands the documentation shows still work as written.

Every fenced block of README.md, docs/*.md and experiments/README.md is read. What happens to
a command depends on the block's info string and on an explicit marker, an HTML comment on
the line before the block:

- ```` ```sh ```` / ```` ```bash ```` / ```` ```console ```` blocks hold commands (a leading
  ``$ `` is dropped, ``\\`` continues a line, ``&&`` separates commands, ``#`` starts a
  comment). Unmarked, each one must be a ``logprob-drift`` (or ``python -m
  pytest_logprob_drift``) command and is **run as written** in a sandbox directory that
  holds the fixtures the docs name (``experiments/``, ``logs/exp_001/``, ``drift.jsonl``,
  ``./my-model``, ``prompts.jsonl``), in the order the page shows them: ``plan`` and
  ``--help`` in the fast test, the engine-free commands that load torch or transformers
  (``prompts``, ``init``, ``import``, ``report``, ``verify``) in the slow one. An unmarked
  ``run`` or any other program fails the test: mark the block.
- ``<!-- docs-test: parse-only -->``: commands that need an engine, a GPU or set-up. Each
  ``logprob-drift`` command must parse (argparse accepts it, and a CONFIG it names exists);
  each ``pytest`` command may use only ``--drift-*`` flags the plugin declares; anything else
  (``bash scripts/setup.sh``, ``pip``) is shown, not checked.
- ``<!-- docs-test: skip REASON -->``: not checked at all (a REASON is required).
- Any other block (````` ``` `````, ```` ```text ````): a ``logprob-drift`` line in it is a
  synopsis; every ``--flag`` it names must be an option of that command.

The README's test command must also be the command ``.ci/run`` runs.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "experiments" / "README.md",
]
SHELL = {"sh", "bash", "console", "shell"}
MARKER = re.compile(r"<!--\s*docs-test:\s*(parse-only|skip)\b\s*(.*?)\s*-->")
FAST = {"plan"}
"""Subcommands the fast test runs as written (torch-free); ``--help`` of any command too."""
ENGINE_FREE = {"prompts", "init", "import", "report", "verify"}
"""Subcommands the slow test runs as written: no engine, but torch or transformers."""
CLI_PREFIXES = (
    ("logprob-drift",),
    (".venv/bin/logprob-drift",),
    ("python", "-m", "pytest_logprob_drift"),
)
PYTEST_PREFIXES = (("pytest",), ("python", "-m", "pytest"), (".venv/bin/python", "-m", "pytest"))
README_TEST_COMMAND = "bash scripts/setup.sh && .venv/bin/python -m pytest -n 2 --dist loadfile -q"


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    mode: str
    """``run``, ``parse-only``, ``skip`` or ``synopsis``."""
    text: str

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    found = []
    lines = page.read_text(encoding="utf-8").split("\n")
    i = 0
    while i < len(lines):
        opening = re.match(r"^(\s*)(```+)\s*([\w-]*)", lines[i])
        if not opening:
            i += 1
            continue
        fence, lang = opening.group(2), opening.group(3).lower()
        start = i
        i += 1
        body = []
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        before = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        marker = MARKER.search(before)
        if marker:
            mode = marker.group(1)
            if mode == "skip" and not marker.group(2):
                pytest.fail(f"{page.name}:{start + 1}: `docs-test: skip` needs a reason")
        elif lang in SHELL:
            mode = "run"
        else:
            mode = "synopsis"
        found.append(Block(page, start + 1, lang, mode, "\n".join(body)))
    return found


ALL_BLOCKS = [b for page in PAGES if page.is_file() for b in blocks(page)]


def commands(block: Block) -> list[list[str]]:
    """The block's commands as argument lists (continuations joined, ``&&`` split)."""
    joined = re.sub(r"\\\n\s*", " ", block.text)
    result = []
    for line in joined.split("\n"):
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:]
        if not line or line.startswith("#"):
            continue
        words = shlex.split(line, comments=True)
        while words:
            if "&&" in words:
                k = words.index("&&")
                result.append(words[:k])
                words = words[k + 1 :]
            else:
                result.append(words)
                words = []
    return [c for c in result if c]


def _strip(words: list[str], prefixes: tuple[tuple[str, ...], ...]) -> list[str] | None:
    for prefix in prefixes:
        if tuple(words[: len(prefix)]) == prefix:
            return words[len(prefix) :]
    return None


def cli_args(words: list[str]) -> list[str] | None:
    """The arguments after ``logprob-drift`` (None: not a logprob-drift command)."""
    return _strip(words, CLI_PREFIXES)


def _parser() -> argparse.ArgumentParser:
    from pytest_logprob_drift.cli import build_parser

    return build_parser()


def _subcommand_options(command: str | None) -> set[str]:
    parser = _parser()
    if command is None:
        return set(parser._option_string_actions)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if command not in sub.choices:
        return set()
    return set(sub.choices[command]._option_string_actions)


def _parses(args: list[str]) -> str | None:
    """None when argparse accepts ``args``; else its message."""
    if "--help" in args or "-h" in args:
        return None
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            _parser().parse_args(args)
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            return stderr.getvalue().strip() or f"exit {exit_.code}"
    return None


def _plugin_flags() -> set[str]:
    from pytest_logprob_drift.plugin.options import OPTIONS

    return {option.flag for option in OPTIONS}


def test_every_page_has_blocks_the_test_understands() -> None:
    assert any(b.page.name == "README.md" for b in ALL_BLOCKS)
    for block in ALL_BLOCKS:
        if block.mode != "run":
            continue
        for words in commands(block):
            args = cli_args(words)
            assert args is not None, (
                f"{block.where()}: {shlex.join(words)!r} is not a logprob-drift command the "
                "docs test can run: mark the block <!-- docs-test: parse-only --> or "
                "<!-- docs-test: skip REASON -->"
            )
            command = next((a for a in args if not a.startswith("-")), None)
            if "--help" in args or "-h" in args:
                continue
            assert command in FAST | ENGINE_FREE, (
                f"{block.where()}: `logprob-drift {command}` needs an engine: mark the block "
                "<!-- docs-test: parse-only -->"
            )


def test_every_shown_command_parses() -> None:
    plugin = _plugin_flags()
    for block in ALL_BLOCKS:
        if block.mode == "skip":
            continue
        if block.mode == "synopsis":
            for line in block.text.split("\n"):
                words = line.split()
                args = cli_args(words)
                if args is None or not args:
                    continue
                command = args[0] if not args[0].startswith("-") else None
                known = _subcommand_options(command)
                for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line):
                    assert flag in known, (
                        f"{block.where()}: `logprob-drift {command or ''}` has no option {flag}"
                    )
            continue
        for words in commands(block):
            args = cli_args(words)
            if args is not None:
                problem = _parses(args)
                assert problem is None, f"{block.where()}: {shlex.join(words)}: {problem}"
                if args and args[0] in ("run", "plan") and len(args) > 1:
                    config = next(a for a in args[1:] if not a.startswith("-"))
                    if config.startswith("experiments/"):
                        assert (ROOT / config).is_file(), f"{block.where()}: no {config}"
                continue
            pytest_args = _strip(words, PYTEST_PREFIXES)
            if pytest_args is not None:
                for arg in pytest_args:
                    flag = arg.split("=", 1)[0]
                    if flag.startswith("--drift"):
                        assert flag in plugin, f"{block.where()}: the plugin has no {flag}"


def test_the_readme_test_command_is_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert README_TEST_COMMAND in readme
    ci = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert ci[-1] == README_TEST_COMMAND


def test_the_readme_main_job_runs_a_shipped_experiment() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    main_job = (
        "bash scripts/setup.sh && .venv/bin/logprob-drift run "
        "experiments/cross_config_s1_vllm_cpu_tiny.json --runtime vllm-hf "
        "--expect rollout.dtype=bfloat16=MISMATCH"
    )
    assert main_job in readme
    assert _parses(shlex.split(main_job.split("&&")[1])[1:]) is None


# ------------------------------------------------------------------ running them as written


def _fixtures(sandbox: Path, *, models: bool) -> None:
    """What the documented commands name, at the paths they name."""
    sys.path.insert(0, str(ROOT / "tests"))
    import numpy as np
    from production_dumps import make_samples, neutral_rows, write_jsonl, write_nemo_rl_step

    (sandbox / "experiments").symlink_to(ROOT / "experiments")
    rng = np.random.default_rng(39)
    logs = sandbox / "logs" / "exp_001"
    logs.mkdir(parents=True)
    write_nemo_rl_step(logs, 1, make_samples(rng, 4))
    write_nemo_rl_step(logs, 2, make_samples(rng, 4, planted=[(0, 2, 0.05)]))
    write_jsonl(
        sandbox / "drift.jsonl",
        [*neutral_rows(1, make_samples(rng, 4)), *neutral_rows(2, make_samples(rng, 4))],
    )
    if models:
        from pytest_logprob_drift.runtimes.tiny_model import (
            TINY_ARCHITECTURES,
            build_tiny_architecture,
        )

        llama = next(a for a in TINY_ARCHITECTURES if a.name.startswith("llama"))
        build_tiny_architecture(llama, sandbox / "my-model")  # it has a chat template
        with open(sandbox / "prompts.jsonl", "w", encoding="utf-8") as f:
            for text in ("What is 2 + 2?", "Name a prime number.", "Say hello."):
                f.write(json.dumps({"messages": [{"role": "user", "content": text}]}) + "\n")


def _runnable(kinds: set[str]) -> Iterator[tuple[Block, list[Block]]]:
    for page in PAGES:
        shown = [b for b in ALL_BLOCKS if b.page == page and b.mode == "run"]
        if any(
            (cli_args(words) or ["?"])[0] in kinds or "--help" in words
            for b in shown
            for words in commands(b)
        ):
            yield shown[0], shown


def _run_as_written(blocks_: list[Block], sandbox: Path, kinds: set[str]) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    for block in blocks_:
        for words in commands(block):
            args = cli_args(words) or []
            help_ = "--help" in args or "-h" in args
            if not help_ and (not args or args[0] not in kinds):
                continue
            result = subprocess.run(
                [sys.executable, "-m", "pytest_logprob_drift", *args],
                cwd=sandbox,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            assert result.returncode in (0, 1), (
                f"{block.where()}: {shlex.join(words)} exited {result.returncode}: "
                f"{result.stderr.strip()[-2000:]}"
            )


def test_plan_and_help_commands_run_as_written(tmp_path: Path) -> None:
    ran = 0
    for first, shown in _runnable(FAST):
        sandbox = tmp_path / first.page.name
        sandbox.mkdir()
        (sandbox / "experiments").symlink_to(ROOT / "experiments")
        _run_as_written(shown, sandbox, FAST)
        ran += 1
    assert ran


@pytest.mark.slow
def test_engine_free_commands_run_as_written(tmp_path: Path) -> None:
    ran = 0
    for first, shown in _runnable(ENGINE_FREE):
        sandbox = tmp_path / first.page.name
        sandbox.mkdir()
        _fixtures(sandbox, models=any("--checkpoint" in b.text for b in shown))
        _run_as_written(shown, sandbox, FAST | ENGINE_FREE)
        ran += 1
        shutil.rmtree(sandbox, ignore_errors=True)
    assert ran
