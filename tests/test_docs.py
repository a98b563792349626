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
ENGINE_FREE = {"prompts", "init", "import", "report", "verify", "tiny"}
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


VENV = ROOT / ".venv"
"""The README's set-up (``scripts/setup.sh``) made this environment: a fresh shell after it,
activated as the README says once, is what a reader types the commands into."""


def _shell_env() -> dict[str, str]:
    """A fresh shell's environment after ``source .venv/bin/activate``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env.pop("PYTHONPATH", None)
    env["VIRTUAL_ENV"] = str(VENV)
    env["PATH"] = os.pathsep.join([str(VENV / "bin"), env.get("PATH", "")])
    return env


def _run_as_written(blocks_: list[Block], sandbox: Path, kinds: set[str]) -> None:
    """Each command of ``kinds`` exactly as printed, in a fresh ``bash`` in ``sandbox``."""
    env = _shell_env()
    for block in blocks_:
        for words in commands(block):
            args = cli_args(words) or []
            help_ = "--help" in args or "-h" in args
            if not help_ and (not args or args[0] not in kinds):
                continue
            result = subprocess.run(
                ["bash", "--noprofile", "--norc", "-c", shlex.join(words)],
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


@pytest.mark.process
def test_plan_and_help_commands_run_as_written(tmp_path: Path) -> None:
    assert (VENV / "bin" / "logprob-drift").is_file(), "no .venv: run bash scripts/setup.sh"
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
    assert (VENV / "bin" / "logprob-drift").is_file(), "no .venv: run bash scripts/setup.sh"
    ran = 0
    for first, shown in _runnable(ENGINE_FREE):
        sandbox = tmp_path / first.page.name
        sandbox.mkdir()
        _fixtures(sandbox, models=any("--checkpoint" in b.text for b in shown))
        _run_as_written(shown, sandbox, FAST | ENGINE_FREE)
        ran += 1
        shutil.rmtree(sandbox, ignore_errors=True)
    assert ran


# ------------------------------------------------------------------ how the pages read

WORDS = ROOT / "docs" / "WORDS.md"
PROSE_PAGES = [page for page in PAGES if page.is_file()]
SENTENCE_START = re.compile(r"[A-Z0-9`*\[!\"(<_|>]|(vLLM|pytest|verl|slime)\b")
"""What a section's first sentence may start with (a lowercase word or a stray punctuation
mark is a sentence cut off above it)."""
SENTENCE_END = re.compile(r"[.:?!][)*_\"'`]*$")


def _prose(page: Path) -> list[str]:
    """The page's lines with fenced blocks and HTML comments blanked (line numbers kept)."""
    lines = page.read_text(encoding="utf-8").split("\n")
    out: list[str] = []
    fence: str | None = None
    comment = False
    for line in lines:
        stripped = line.strip()
        if fence is not None:
            out.append("")
            if stripped.startswith(fence):
                fence = None
            continue
        opening = re.match(r"^(```+|~~~+)", stripped)
        if opening:
            fence = opening.group(1)
            out.append("")
            continue
        if comment or stripped.startswith("<!--"):
            comment = "-->" not in stripped
            out.append("")
            continue
        out.append(line)
    return out


TABLE_ROW = re.compile(r"\s*\|[\s:-]")
OPENS_A_BLOCK = re.compile(r"\s*(```|~~~|<!--)")


def _blocks(page: Path) -> list[tuple[int, list[str], str]]:
    """``(first line number, lines, next raw line)`` of each run of prose lines between blank
    lines, fenced blocks and comments; the next raw line says what follows it."""
    raw = page.read_text(encoding="utf-8").split("\n")
    found: list[tuple[int, list[str], str]] = []
    current: list[str] = []
    start = 0
    for number, line in enumerate([*_prose(page), ""], start=1):
        if line.strip():
            if not current:
                start = number
            current.append(line)
            continue
        if current:
            after = next((x for x in raw[number - 1 :] if x.strip()), "")
            found.append((start, current, after))
        current = []
    return found


def _paragraphs(page: Path) -> list[tuple[int, list[str]]]:
    """``(first line number, lines)`` of each plain paragraph that does not lead into a shown
    block: not a heading, a list, a table, an image, a quote or HTML."""
    return [
        (start, lines)
        for start, lines, after in _blocks(page)
        if not re.match(r"\s*([#>!<]|[-*+] |\d+\. )", lines[0])
        and not TABLE_ROW.match(lines[0])
        and not OPENS_A_BLOCK.match(after)
    ]


def _sections(page: Path) -> list[tuple[int, str]]:
    """``(line number, first line)`` of the prose right under each heading (none when a shown
    block comes first)."""
    raw = page.read_text(encoding="utf-8").split("\n")
    lines = _prose(page)
    found = []
    for i, line in enumerate(lines):
        if not re.match(r"#{1,6} ", line):
            continue
        text = next(((k, x) for k, x in enumerate(raw[i + 1 :], start=i + 2) if x.strip()), None)
        if text is not None and not re.match(r"#{1,6} ", text[1]) and lines[text[0] - 1].strip():
            found.append(text)
    return found


def _tables(page: Path) -> list[tuple[int, list[str]]]:
    return [(start, lines) for start, lines, _ in _blocks(page) if TABLE_ROW.match(lines[0])]


def _cells(row: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


def _section_problems(page: Path) -> list[str]:
    return [
        f"{_name(page)}:{number}: a section starts mid-sentence: {line.strip()[:60]!r}"
        for number, line in _sections(page)
        if not re.match(r"\s*([-*+] |\d+\. )", line) and not SENTENCE_START.match(line.strip())
    ]


def _paragraph_problems(page: Path) -> list[str]:
    problems = []
    for number, lines in _paragraphs(page):
        text = " ".join(x.strip() for x in lines)
        where = f"{_name(page)}:{number}"
        if not SENTENCE_END.search(text):
            problems.append(f"{where}: a paragraph ends without punctuation: ...{text[-60:]!r}")
        bare = re.sub(r"`[^`]*`", "", text)
        if bare.count("(") != bare.count(")"):
            problems.append(f"{where}: a parenthesis left open or never opened: {text[:70]!r}")
    return problems


def _table_problems(page: Path) -> list[str]:
    problems = []
    for number, rows in _tables(page):
        where = f"{_name(page)}:{number}"
        if len(rows) < 2 or re.fullmatch(r"[|:\-\s]+", rows[0]):
            problems.append(f"{where}: a table without a header row")
        elif not re.fullmatch(r"\s*\|?(\s*:?-{3,}:?\s*\|)+\s*(:?-{3,}:?)?\s*", rows[1]):
            problems.append(f"{where}: the header row is not followed by its separator")
        elif not all(_cells(rows[0])):
            problems.append(f"{where}: a header cell is empty")
    return problems


def test_no_section_starts_mid_sentence() -> None:
    assert [p for page in PROSE_PAGES for p in _section_problems(page)] == []


VERBATIM = {"CONTRACT.md"}
"""Pages kept verbatim from elsewhere, as plain text (no Markdown paragraphs to check)."""


def test_every_paragraph_ends_its_sentence() -> None:
    assert [
        p for page in PROSE_PAGES if page.name not in VERBATIM for p in _paragraph_problems(page)
    ] == []


def test_every_table_has_a_header_row() -> None:
    assert [p for page in PROSE_PAGES for p in _table_problems(page)] == []


def test_the_checks_catch_the_cuts_they_are_for(tmp_path: Path) -> None:
    """Each check fails on the kind of cut it is for (a page split mid-sentence)."""
    page = tmp_path / "cut.md"
    page.write_text(
        "# Title\n\nA sentence that stops at the chat template's\n\n"
        "## Exit codes\n\nselector that matches no case, exit 2.\n\n"
        "Outcomes: PASS (fallback, ignored setting.\n\n"
        "## Runtimes\n\n|---|---|\n| `hf` | transformers |\n",
        encoding="utf-8",
    )
    assert len(_section_problems(page)) == 1
    assert [p.split(": ", 1)[1][:22] for p in _paragraph_problems(page)] == [
        "a paragraph ends witho",
        "a parenthesis left ope",
    ]
    assert [p.split(": ", 1)[1] for p in _table_problems(page)] == ["a table without a header row"]


def _terms() -> list[tuple[str, re.Pattern[str], str]]:
    """``(term, its pattern, its anchor)`` of every word of the Words page."""
    terms = []
    for line in WORDS.read_text(encoding="utf-8").split("\n"):
        match = re.match(r"### (.+)", line)
        if not match:
            continue
        term = match.group(1).strip()
        anchor = re.sub(r"[^\w\- ]", "", term.lower()).replace(" ", "-")
        if term == "S0 to S3":
            pattern = re.compile(r"\bS[0-3]\b")
        else:
            pattern = re.compile(r"(?<![\w/#.-])" + re.escape(term).replace("\\ ", r"\s+"), re.I)
        terms.append((term, pattern, anchor))
    return terms


def test_the_words_page_is_linked_from_the_readme_first_screen() -> None:
    first_screen = "\n".join(_prose(ROOT / "README.md")[:40])
    assert "(docs/WORDS.md)" in first_screen
    assert len(_terms()) >= 6


def test_every_word_is_linked_or_defined_before_its_first_use() -> None:
    problems = []
    for page in PROSE_PAGES:
        if page == WORDS:
            continue
        text = "\n".join(_prose(page))
        prefix = os.path.relpath(WORDS, page.parent)
        for term, pattern, anchor in _terms():
            # a use is prose: not a link target, not inside a URL
            uses = [
                m
                for m in pattern.finditer(text)
                if not re.search(r"\]\([^)]*$", text[: m.start()][-200:])
            ]
            if not uses:
                continue
            first = uses[0]
            end = text.find("\n\n", first.end())
            end = len(text) if end < 0 else end
            link = text.find(f"]({prefix}#{anchor})")
            defined = text.find(f"**{term}**")
            if not (0 <= link < end or 0 <= defined <= first.start()):
                problems.append(
                    f"{page.relative_to(ROOT)}:{text[: first.start()].count(chr(10)) + 1}: "
                    f"{term!r} is used before it is defined or linked to {prefix}#{anchor}"
                )
    assert problems == []
