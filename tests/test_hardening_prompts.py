"""Hostile input to ``prompts`` and ``init`` (issue 40, items 1-4, 6 and 7 for these commands).

Every bad input ends in one line naming what and where, exit 2, no traceback and nothing
written. A command whose exit code and streams are all a test asks runs in this process
(``drift_testing.cli``). What could hang or exhaust memory if it regressed (``process`` tests)
runs as the real command (``python -m pytest_logprob_drift``) under a wrapper process that caps
its address space and reads the CPU time and peak resident set of it and its chat template
renderer (``RUSAGE_CHILDREN``), compared with an ordinary ``prompts`` run measured the same way:
CPU time, not wall time, so a busy machine does not change the outcome.

1. a chat template that never finishes (a loop bomb) or makes a 3 GB string ends at its bound
   (``TEMPLATE_SECONDS`` of CPU time, the 1 MiB output bound) in one line naming the template's
   file, its line and the bound; the sandbox still refuses ``__class__``, ``cycler`` and ``lipsum``
   escapes and keeps ``lipsum``, doubling and folding bombs within the bounds;
2. ``--limit``/``--max-prompt-tokens`` at the largest value a prompt file may hold write a
   file ``init`` and ``plan`` accept; one more is refused where it is parsed (likewise
   ``init --seed``/``--max-new-tokens``);
3. a lone surrogate in a JSONL text, a tokenizer.json or tokenizer_config.json nested 100,000
   levels deep: exit 2 naming the file and line, not an internal error;
4. a 6 MiB and a 30 MiB prompt line are refused by the prompt bound before tokenizing, a
   3.5 GiB sparse tokenizer.json by its size before transformers reads it;
6. a UTF-8 BOM at the start of a plain-text file is dropped (documented); a lone surrogate in
   chat messages names the message, not the chat template;
7. the paths ``prompts`` and ``init`` print are escaped.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from drift_testing import cli

transformers = pytest.importorskip("transformers")

import pytest_logprob_drift  # noqa: E402
from pytest_logprob_drift.config.prompt_input import MAX_PROMPT_BYTES  # noqa: E402
from pytest_logprob_drift.config.prompt_source import TOKENIZER_FILES  # noqa: E402
from pytest_logprob_drift.errors import UsageError  # noqa: E402
from pytest_logprob_drift.runtimes import chat_template  # noqa: E402
from pytest_logprob_drift.runtimes.chat_template import (  # noqa: E402
    TEMPLATE_MEMORY_BYTES,
    TEMPLATE_SECONDS,
    ChatRenderer,
    TemplateBoundError,
)
from pytest_logprob_drift.runtimes.tiny_model import (  # noqa: E402
    TINY_ARCHITECTURES,
    build_tiny_architecture,
)

LLAMA = next(a for a in TINY_ARCHITECTURES if a.name.startswith("llama"))
PACKAGE_ROOT = str(Path(pytest_logprob_drift.__file__).resolve().parents[1])
TIMEOUT = 600.0
"""Wall seconds a command may take before the test calls it a hang: a backstop only, far above
any run on a loaded machine (an ordinary ``prompts`` run of the real command takes 5-15 s,
most of it importing transformers; before the fix the loop bomb ran on)."""
ADDRESS_SPACE = 4 << 30
"""Address-space cap of a fresh interpreter's command: room for transformers; a 3 GB string
does not fit."""
SLACK_CPU_SECONDS = TEMPLATE_SECONDS + 10.0
"""How much more CPU time (user and system, the command and its renderer) than an ordinary run
a refused bomb may take: the renderer's own bound, plus what importing transformers varies."""
SLACK_RSS_KB = 128 * 1024
"""How much more than an ordinary run a refused bomb's peak resident set may be (KiB)."""

_WRAPPER = """
import json, resource, subprocess, sys, time
def cap():
    resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap}))
start = time.monotonic()
try:
    proc = subprocess.run(
        sys.argv[1:], capture_output=True, text=True, timeout={timeout}, preexec_fn=cap
    )
    code, out, err = proc.returncode, proc.stdout, proc.stderr
except subprocess.TimeoutExpired:
    code, out, err = None, "", "timed out"
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({{
    "code": code, "out": out, "err": err, "wall": time.monotonic() - start,
    "cpu_s": usage.ru_utime + usage.ru_stime, "rss_kb": usage.ru_maxrss,
}}))
"""


def logprob_drift_process(*args: str | Path) -> dict[str, Any]:
    """``python -m pytest_logprob_drift ARGS`` (address space capped): its exit code (None: it
    ran past ``TIMEOUT``), stdout, stderr, wall seconds, and the CPU seconds and peak resident
    set (KiB) of it and its children, measured by a wrapper process of its own."""
    wrapper = _WRAPPER.format(cap=ADDRESS_SPACE, timeout=TIMEOUT)
    argv = [sys.executable, "-m", "pytest_logprob_drift", *map(str, args)]
    proc = subprocess.run(
        [sys.executable, "-c", wrapper, *argv],
        capture_output=True,
        text=True,
        timeout=TIMEOUT + 60,
        check=True,
        env={**os.environ, "PYTHONPATH": PACKAGE_ROOT},
    )
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def logprob_drift(*args: str | Path) -> dict[str, Any]:
    """``logprob-drift ARGS`` in this process (``drift_testing.cli``): exit code, stdout,
    stderr."""
    code, out, err = cli(*args)
    return {"code": code, "out": out, "err": err}


def one_error_line(result: dict[str, Any], *needles: str) -> str:
    """The one error line of a refused command (exit 2, no traceback), with each needle."""
    err = result["err"]
    assert result["code"] == 2, result
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    for needle in needles:
        assert needle in line, (needle, line)
    return line


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama checkpoint (its chat template writes role headers)."""
    model_dir = tmp_path_factory.mktemp("hardening-prompts") / LLAMA.name
    build_tiny_architecture(LLAMA, model_dir)
    return model_dir


def tokenizer_copy(llama: Path, target: Path, **changes: str | bytes) -> Path:
    """The tokenizer files (and config.json) of ``llama`` in ``target``, with ``changes``:
    file name -> new text; ``chat_template``: the template tokenizer_config.json holds."""
    target.mkdir()
    for name in (*TOKENIZER_FILES, "config.json"):
        if (llama / name).is_file():
            shutil.copyfile(llama / name, target / name)
    if "chat_template" in changes:
        config = json.loads((target / "tokenizer_config.json").read_text())
        config["chat_template"] = changes.pop("chat_template")
        (target / "tokenizer_config.json").write_text(json.dumps(config))
    for name, content in changes.items():
        path = target / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return target


def _ordinary(run: Callable[..., dict[str, Any]], llama: Path, root: Path) -> dict[str, Any]:
    source = root / "p.txt"
    source.write_text("The rollout engine samples a response.\n")
    result = run(
        "prompts", "--checkpoint", llama, source, "--chat-template", "--output", root / "o.json"
    )
    assert result["code"] == 0, result
    return result


@pytest.fixture(scope="module")
def ordinary(llama: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An ordinary chat ``prompts`` run of the real command: the CPU time and peak memory bombs
    run the same way are held to."""
    return _ordinary(logprob_drift_process, llama, tmp_path_factory.mktemp("ordinary"))


def assert_bounded(result: dict[str, Any], ordinary: dict[str, Any]) -> None:
    """Within ``SLACK_CPU_SECONDS`` and ``SLACK_RSS_KB`` of an ordinary run measured the same
    way (the command and its renderer)."""
    assert result["cpu_s"] <= ordinary["cpu_s"] + SLACK_CPU_SECONDS, (result, ordinary)
    assert 0 <= result["rss_kb"] <= ordinary["rss_kb"] + SLACK_RSS_KB, (result, ordinary)


# ------------------------------------------------------------------ 1. the chat template


@pytest.mark.parametrize(
    ("name", "template", "needles"),
    [
        (
            "loop",
            "{{ bos_token }}\n{% for a in range(100000) %}{% for b in range(100000) %}"
            "{% endfor %}{% endfor %}",
            [f"used more than its bound of {TEMPLATE_SECONDS:g} s of CPU time", "template line 2"],
        ),
        (
            "multiplication",
            "{{ bos_token }}\n\n{{ 'x' * 3000000000 }}",
            [
                "makes a value of 3000000000 characters (over the bound of 1 MiB)",
                "at template line 3",
            ],
        ),
    ],
)
@pytest.mark.process  # the real command, its address space capped, its CPU time measured
def test_a_template_bomb_ends_at_its_bound_in_one_line(
    llama: Path,
    ordinary: dict[str, Any],
    tmp_path: Path,
    name: str,
    template: str,
    needles: list[str],
) -> None:
    assert_template_bomb_refused(
        logprob_drift_process, llama, tmp_path / name, template, needles, ordinary
    )


def assert_template_bomb_refused(
    command: Callable[..., dict[str, Any]],
    llama: Path,
    work: Path,
    template: str,
    needles: list[str],
    ordinary: dict[str, Any],
) -> None:
    """``prompts --chat-template`` with ``template`` in the tokenizer, run by ``command``: one
    error line naming the template's file, the prompt and ``needles``, bounded like
    ``ordinary`` (measured the same way), nothing written."""
    checkpoint = tokenizer_copy(llama, work, chat_template=template)
    source = work.parent / f"{work.name}.jsonl"
    source.write_text('{"text": "hello"}\n')
    output = work.parent / f"{work.name}.out.json"
    result = command(
        "prompts", "--checkpoint", checkpoint, source, "--chat-template", "--output", output
    )
    one_error_line(
        result,
        f"{checkpoint / 'tokenizer_config.json'}: the chat template ",
        f"rendering the prompt of {source}:1",
        *needles,
    )
    assert_bounded(result, ordinary)
    assert not output.exists()


def _rendered(template: str, content: str = "hi") -> str:
    with ChatRenderer(template, {"bos_token": "<s>"}, "tokenizer_config.json") as renderer:
        return renderer.render([{"role": "user", "content": content}], "p.jsonl:1")


def _refusal(template: str) -> str | None:
    """The one-line refusal rendering ``template`` raises (None: it rendered), in a renderer
    process of its own."""
    try:
        _rendered(template)
    except UsageError as exc:
        return str(exc)
    return None


BOMBS = [
    ("{{ messages.__class__.__mro__ }}", ["p.jsonl:1: the chat template refused it", "unsafe"]),
    ("{{ cycler.__init__.__globals__ }}", ["refused it", "'__init__'", "unsafe"]),
    ("{{ lipsum.__globals__.os }}", ["refused it", "'__globals__'", "unsafe"]),
    # the renderer's own bounds firing (its CPU-time timer, its RLIMIT_AS): ``process``
    pytest.param(
        "{% set x = lipsum(n=10000000) %}x",
        [f"used more than its bound of {TEMPLATE_SECONDS:g} s of CPU time"],
        marks=pytest.mark.process,
    ),
    pytest.param(
        "{% set ns = namespace(s='x') %}\n{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}{{ ns.s|length }}",
        [f"needs more memory than its bound of {TEMPLATE_MEMORY_BYTES >> 20} MiB", "line 2"],
        marks=pytest.mark.process,
    ),
    pytest.param(
        "{{ 'x'|center(3000000000) }}",
        ["needs more memory than its bound"],
        marks=pytest.mark.process,
    ),
    (
        "{{ (10 ** 100000) ** 100000 }}",
        ["makes an integer of about", "over the bound of 1 MiB"],
    ),
    ("{{ [1] * 2000000 }}", ["makes a value of 2000000 items"]),
    (
        "x\n{% for i in range(100000) %}{{ 'y' * 100 }}{% endfor %}",
        ["renders more than its output bound of 1 MiB at template line 2"],
    ),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", ["recursed deeper"]),
    (
        "ok\n{% for %}",
        ["tokenizer_config.json: the chat template does not compile at template line 2"],
    ),
    (
        "\n\n{{ raise_exception('only user turns') }}",
        ["p.jsonl:1: the chat template refused it at template line 3: only user turns"],
    ),
]


@pytest.mark.parametrize(
    ("template", "needles"),
    BOMBS,
)
def test_the_sandbox_refuses_escapes_and_bounds_every_bomb(
    template: str, needles: list[str]
) -> None:
    message = _refusal(template)
    assert message is not None, f"{template!r} rendered"
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)


@pytest.mark.process  # a wall-clock bound (the parent's backstop)
def test_a_renderer_that_gives_no_answer_is_killed_at_the_wall_backstop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stopped renderer spends no CPU time, so its own timer (``TEMPLATE_SECONDS`` of CPU
    time) never fires: the parent's wall backstop (``TEMPLATE_WALL_SECONDS``, 1 s here) kills
    it and says so in one line naming the template's file and the prompt."""
    monkeypatch.setattr(chat_template, "TEMPLATE_WALL_SECONDS", 1.0)
    with ChatRenderer("{{ bos_token }}", {"bos_token": "<s>"}, "tokenizer_config.json") as renderer:
        os.kill(renderer._proc.pid, signal.SIGSTOP)
        with pytest.raises(TemplateBoundError) as raised:
            renderer.render([{"role": "user", "content": "hi"}], "p.jsonl:1")
        assert renderer._proc.returncode == -signal.SIGKILL
    assert str(raised.value) == (
        "tokenizer_config.json: the chat template did not finish within 1 s of wall time "
        "(rendering the prompt of p.jsonl:1); killed"
    )


def test_the_bounded_renderer_renders_as_transformers_does() -> None:
    """A template using what real ones use (loop controls, namespace, tojson, the generation
    tag, special tokens, the generation prompt) renders the text ``apply_chat_template``
    renders; a prompt at the output bound renders, one character more does not."""
    from transformers.utils.chat_template_utils import render_jinja_template

    template = (
        "{{ bos_token }}{% set ns = namespace(n=0) %}{% for m in messages %}"
        "{% if m.role == 'system' %}{% continue %}{% endif %}{% set ns.n = ns.n + 1 %}"
        "{% generation %}[{{ ns.n }}:{{ m.role|upper }}] {{ m.content|trim }}"
        "{% endgeneration %}\n{{ m|tojson }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}{{ eos_token }}"
    )
    messages = [
        {"role": "system", "content": "skip"},
        {"role": "user", "content": "  café \u65e5\u672c  "},
        {"role": "assistant", "content": 'quote " and \\ backslash'},
    ]
    variables = {"bos_token": "<s>", "eos_token": "</s>"}
    expected = render_jinja_template(
        [messages], chat_template=template, add_generation_prompt=True, **variables
    )[0][0]
    with ChatRenderer(template, variables, "t.json") as renderer:
        assert renderer.render(messages, "p:1") == expected
    exact = "{{ messages[0].content }}"
    assert len(_rendered(exact, "x" * MAX_PROMPT_BYTES)) == MAX_PROMPT_BYTES
    with pytest.raises(UsageError, match="renders more than its output bound"):
        _rendered(exact + "!", "x" * MAX_PROMPT_BYTES)


# ------------------------------------------------------------ 2. numeric options, bounded


def test_the_largest_limit_writes_a_file_init_and_plan_accept(llama: Path, tmp_path: Path) -> None:
    source = tmp_path / "p.txt"
    source.write_text("The rollout engine samples.\nDoes it drift?\n")
    prompts = tmp_path / "prompts.json"
    largest = str(2**64 - 1)
    result = logprob_drift(
        "prompts", "--checkpoint", llama, source, "--output", prompts,
        "--limit", largest, "--max-prompt-tokens", largest,
    )  # fmt: skip
    assert result["code"] == 0, result
    recorded = json.loads(prompts.read_text())["source"]
    assert recorded["limit"] == recorded["max_prompt_tokens"] == 2**64 - 1
    # 7: the path init prints is escaped (ESC and BEL in the file name).
    config = tmp_path / "exp\x1b[2J\a.json"
    result = logprob_drift(
        "init", "--checkpoint", llama, "--prompts", prompts, "--runtime", "hf",
        "--output", config, "--seed", str(2**32 - 1),
    )  # fmt: skip
    assert result["code"] == 0, result
    assert "\x1b" not in result["out"] and "\a" not in result["out"]
    assert "exp\\x1b[2J\\x07.json" in result["out"]
    result = logprob_drift("plan", config)
    assert result["code"] == 0, result


@pytest.mark.parametrize(
    ("command", "flag", "value", "bound"),
    [
        ("prompts", "--limit", str(2**64), "1 .. 2**64 - 1"),
        ("prompts", "--max-prompt-tokens", str(10**30), "1 .. 2**64 - 1"),
        ("prompts", "--limit", "0", "1 .. 2**64 - 1"),
        ("prompts", "--limit", "9" * 5000, "1 .. 2**64 - 1"),
        ("init", "--seed", str(2**32), f"0 .. {2**32 - 1}"),
        ("init", "--max-new-tokens", str(2**64), "1 .. 2**64 - 1"),
    ],
)
def test_one_above_the_bound_is_refused_where_it_is_parsed(
    tmp_path: Path,
    command: str,
    flag: str,
    value: str,
    bound: str,
) -> None:
    args = (
        ["prompts", tmp_path / "p.txt", "--checkpoint", tmp_path, "--output", tmp_path / "o"]
        if command == "prompts"
        else [
            "init",
            "--checkpoint",
            tmp_path,
            "--prompts",
            tmp_path / "p",
            "--runtime",
            "x",
            "--output",
            tmp_path / "o",
        ]
    )
    result = logprob_drift(*args, flag, value)
    assert result["code"] == 2 and "Traceback" not in result["err"], result
    line = result["err"].strip()
    assert "\n" not in line
    assert line.startswith(f"logprob-drift {command}: error: argument {flag}: expected an integer")
    assert bound in line and len(line) < 200, line
    assert not (tmp_path / "o").exists()


# ------------------------------------------------ 3, 4, 6. bad prompts and tokenizer files


def test_a_lone_surrogate_is_refused_at_reading_naming_the_field(
    llama: Path, tmp_path: Path
) -> None:
    text = tmp_path / "text.jsonl"
    text.write_text('{"text": "fine"}\n{"text": "a\\ud800b"}\n')
    chat = tmp_path / "chat.jsonl"
    chat.write_text(
        '{"m": [{"role": "user", "content": "ok"}, {"role": "user", "content": "\\udc00"}]}\n'
    )
    for source, flags, where in (
        (text, [], f"{text}:2: field 'text' holds a lone surrogate (\\ud800 at character 1)"),
        (
            chat,
            ["--messages-field", "m"],
            f"{chat}:1: field 'm'[1].content holds a lone surrogate (\\udc00",
        ),
    ):
        result = logprob_drift(
            "prompts", "--checkpoint", llama, source, *flags, "--output", tmp_path / "o"
        )
        line = one_error_line(result, where, "not Unicode text")
        assert "chat template" not in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "config.json"])
def test_a_deeply_nested_tokenizer_file_is_one_line(llama: Path, tmp_path: Path, name: str) -> None:
    checkpoint = tokenizer_copy(llama, tmp_path / "ckpt", **{name: "[" * 100_000 + "]" * 100_000})
    source = tmp_path / "p.txt"
    source.write_text("hello\n")
    result = logprob_drift(
        "prompts", "--checkpoint", checkpoint, source, "--output", tmp_path / "o"
    )
    one_error_line(
        result, f"{checkpoint / name}: nested deeper than 128 levels (line 1, column 129)"
    )


@pytest.mark.process  # the real command, its address space capped, its CPU time measured
@pytest.mark.parametrize("mib", [6, 30])
def test_a_prompt_line_over_the_bound_is_refused_before_tokenizing(
    llama: Path,
    ordinary: dict[str, Any],
    tmp_path: Path,
    mib: int,
) -> None:
    source = tmp_path / "p.txt"
    with source.open("w") as f:
        f.write("short\n" + "ab " * (mib * 2**20 // 3) + "\nlast\n")
    result = logprob_drift_process(
        "prompts", "--checkpoint", llama, source, "--output", tmp_path / "o"
    )
    one_error_line(
        result, f"{source}:2: the line is ", "larger than the bound of 1 MiB for one prompt"
    )
    assert_bounded(result, ordinary)
    assert not (tmp_path / "o").exists()


def test_a_prompt_at_the_bound_is_read_and_one_byte_more_is_not(tmp_path: Path) -> None:
    """The bound counts bytes of UTF-8 (what the tokenizer's memory follows), for a text line,
    a JSONL field and the messages of a chat together."""
    from pytest_logprob_drift.config.prompt_input import PromptInputError, read_prompt_inputs

    at = "\u00e9" * (MAX_PROMPT_BYTES // 2)  # two bytes each
    text = tmp_path / "p.txt"
    text.write_text(f"{at}\n")
    assert read_prompt_inputs(text).prompts[0].text == at
    text.write_text(f"{at}x\n")
    with pytest.raises(PromptInputError, match=r"p.txt:1: the line is 1048577 bytes of UTF-8"):
        read_prompt_inputs(text)
    half = "y" * (MAX_PROMPT_BYTES // 2 - 1)  # with the roles: the bound exactly
    chat = tmp_path / "c.jsonl"
    messages = [{"role": "u", "content": half}, {"role": "a", "content": half}]
    chat.write_text(json.dumps({"m": messages}) + "\n")
    assert read_prompt_inputs(chat, messages_field="m").prompts[0].messages is not None
    messages[1]["content"] += "z"
    chat.write_text(json.dumps({"m": messages}) + "\n")
    with pytest.raises(PromptInputError, match=r"c.jsonl:1: the messages of field 'm' is"):
        read_prompt_inputs(chat, messages_field="m")


@pytest.mark.process  # the real command, its address space capped, its CPU time measured
def test_a_huge_sparse_tokenizer_file_is_refused_before_it_is_read(
    llama: Path,
    ordinary: dict[str, Any],
    tmp_path: Path,
) -> None:
    checkpoint = tokenizer_copy(llama, tmp_path / "ckpt")
    with (checkpoint / "tokenizer.json").open("r+b") as f:
        f.truncate(7 << 29)  # 3.5 GiB, sparse
    source = tmp_path / "p.txt"
    source.write_text("hello\n")
    result = logprob_drift_process(
        "prompts", "--checkpoint", checkpoint, source, "--output", tmp_path / "o"
    )
    one_error_line(
        result,
        f"{checkpoint / 'tokenizer.json'}: {7 << 29} bytes, larger than the limit of 512 MiB",
    )
    assert_bounded(result, ordinary)


def test_a_bom_is_dropped_and_the_output_path_is_escaped(llama: Path, tmp_path: Path) -> None:
    source = tmp_path / "p.txt"
    source.write_bytes("\ufeffThe rollout engine samples.\nDoes it drift?\n".encode())
    output = tmp_path / "out\x1b[2J\a.json"
    result = logprob_drift("prompts", "--checkpoint", llama, source, "--output", output)
    assert result["code"] == 0, result
    assert result["out"] == f"wrote 2 prompt(s) to {tmp_path}/out\\x1b[2J\\x07.json\n"
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(llama), local_files_only=True)
    written = json.loads(output.read_text())
    assert written["token_ids"] == [
        tokenizer(text, add_special_tokens=False)["input_ids"]
        for text in ("The rollout engine samples.", "Does it drift?")
    ]
