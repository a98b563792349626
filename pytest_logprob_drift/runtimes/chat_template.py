"""Rendering a checkpoint's chat template under bounds on time, output size and memory.

A chat template is untrusted input: a Jinja program that comes with the checkpoint. Owns
rendering it the way transformers' ``apply_chat_template`` renders it (jinja2's immutable
sandbox with ``trim_blocks``/``lstrip_blocks``, the ``loopcontrols`` extension and the
``{% generation %}`` tag, transformers' ``tojson`` filter and its ``raise_exception`` and
``strftime_now`` globals; the variables ``messages``, ``tools=None``, ``documents=None``,
``add_generation_prompt=True`` and the tokenizer's named special tokens), but in a child
process (``python -m pytest_logprob_drift.runtimes.chat_template``, which imports jinja2 and
nothing of transformers or torch) under bounds:

- time: compiling the template, and rendering each prompt, within ``TEMPLATE_SECONDS`` of the
  child's CPU time (user and system, ``ITIMER_PROF``: the same bound on an idle machine and on
  a loaded one; the child's own timer names the template line it was at), and the parent kills
  a child that gives no answer within ``TEMPLATE_WALL_SECONDS`` of wall time (native code a
  timer cannot interrupt, a stopped child);
- output: what one prompt renders to is at most ``MAX_PROMPT_BYTES`` (the bound every prompt
  is tokenized under, ``config.prompt_input``), counted as it is generated;
- memory: the child's address space may grow by ``TEMPLATE_MEMORY_BYTES`` (``RLIMIT_AS``), and
  the operators that make a value out of thin air (``*``, ``+`` and ``**``) refuse a result
  over the output bound before they compute it;

so a loop bomb or ``'x' * 3000000000`` ends in one line naming the template's file, the
template line and the bound, in CPU seconds and without the memory. The sandbox's own refusals
(``__class__``, private attributes, unsafe callables) are jinja2's. Prompts go to the child
one at a time and each rendered text comes back before the next is sent, so the parent holds
one rendered prompt at a time. Knows nothing about tokenizers, configs or engines.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_logprob_drift.config.input_file import size_text
from pytest_logprob_drift.config.prompt_input import MAX_PROMPT_BYTES
from pytest_logprob_drift.errors import UsageError, one_line
from pytest_logprob_drift.records import JsonObject, JsonValue

TEMPLATE_SECONDS = 2.0
"""CPU seconds (user and system) the template may take to compile, and to render one prompt (a
real chat template renders in milliseconds). CPU time, not wall time: a machine busy with other
work slows the child down but does not change which templates are refused."""
TEMPLATE_WALL_SECONDS = 60.0
"""Wall-clock seconds the parent waits for one answer before it kills the child: a backstop for
what the CPU timer cannot end (native code that never returns to the interpreter, a child that
is stopped or starved), generous enough that a loaded machine never reaches it first."""
TEMPLATE_STARTUP_SECONDS = 60.0
"""Seconds the child may take to start (Python and jinja2) before its first answer."""
TEMPLATE_MEMORY_BYTES = 256 * 2**20
"""How much the child's address space may grow while the template compiles and renders."""
MAX_INT_BITS = 8 * MAX_PROMPT_BYTES
"""The largest integer (in bits) ``*`` and ``**`` make: more than any text within the output
bound can show."""


class TemplateBoundError(UsageError):
    """The chat template ran past a bound (or its renderer ended without an answer)."""


# --------------------------------------------------------------------------- the parent side


class ChatRenderer:
    """A child process rendering one chat template, prompt by prompt (a context manager that
    ends the child). ``template_file``: where the template came from (named in refusals)."""

    def __init__(
        self, template: str, variables: Mapping[str, JsonValue], template_file: Path | str
    ) -> None:
        self.template_file = str(template_file)
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            [sys.executable, "-P", "-m", __name__],  # -P: nothing from the working directory
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            close_fds=True,
            env=_child_environment(),
        )
        self._buffer = b""
        self._started = False
        try:
            self._send({"template": template, "variables": dict(variables)})
            self._answer(None, compiling=True)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> ChatRenderer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        proc = self._proc
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
        self._stderr.close()

    def render(self, messages: Sequence[Mapping[str, str]], where: str) -> str:
        """The text ``messages`` render to, with the generation prompt; ``where``: the
        prompt's input file and line, named in a refusal."""
        self._send({"messages": [dict(m) for m in messages]})
        return self._answer(where, compiling=False)

    def _send(self, request: JsonObject) -> None:
        data = json.dumps(request).encode("ascii") + b"\n"  # \u escapes: any str travels
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.write(data)
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # the child ended: _answer says how

    def _answer(self, where: str | None, *, compiling: bool) -> str:
        seconds = TEMPLATE_WALL_SECONDS
        if not self._started:
            seconds += TEMPLATE_STARTUP_SECONDS
        line = self._read_line(seconds)
        self._started = True
        doing = "compiling it" if compiling else f"rendering the prompt of {where}"
        if line is None:
            self.close_quietly()
            raise TemplateBoundError(
                f"{self.template_file}: the chat template did not finish within "
                f"{TEMPLATE_WALL_SECONDS:g} s of wall time ({doing}); killed"
            )
        if not line:
            code = self._proc.wait()
            raise TemplateBoundError(
                f"{self.template_file}: the chat template's renderer ended without an answer "
                f"({_ended(code)}{self._last_stderr()}) while {doing}"
            )
        answer = json.loads(line)
        if "text" in answer:
            text: str = answer["text"]
            return text
        at = f" at template line {answer['line']}" if answer.get("line") else ""
        message = answer["message"]
        if answer["kind"] == "refused" and where is not None:
            raise UsageError(f"{where}: the chat template refused it{at}: {message}")
        if answer["kind"] == "refused":
            raise UsageError(
                f"{self.template_file}: the chat template does not compile{at}: {message}"
            )
        raise TemplateBoundError(f"{self.template_file}: the chat template {message}{at} ({doing})")

    def close_quietly(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def _read_line(self, seconds: float) -> bytes | None:
        """The child's next answer line (``b""`` at end of output; None: none came within
        ``seconds``)."""
        import time

        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + seconds
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    return None
                chunk = os.read(fd, 2**20)
                if not chunk:
                    return b""
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _last_stderr(self) -> str:
        self._stderr.seek(0)
        lines = self._stderr.read()[-4096:].decode("utf-8", "replace").strip().splitlines()
        return f": {one_line(lines[-1])}" if lines else ""


def _child_environment() -> dict[str, str]:
    """The environment, with this package's own directory first on ``PYTHONPATH`` (so the
    child imports the package the parent runs, however it was installed)."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root if not path else f"{root}{os.pathsep}{path}"}


def _ended(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit {code}"


# --------------------------------------------------------------------------- the child side


class _Deadline(Exception):
    """The CPU timer: the template ran past ``TEMPLATE_SECONDS`` of CPU time."""


class _OverBound(Exception):
    """A value or the output over the output bound."""

    template_line: int | None = None


def _bounded_environment() -> Any:
    import datetime

    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    over = f"over the bound of {size_text(MAX_PROMPT_BYTES)}"

    def sized(value: object) -> int | None:
        return len(value) if isinstance(value, (str, list, tuple)) else None

    def made(size: int, like: object) -> _OverBound:
        unit = "characters" if isinstance(like, str) else "items"
        return _OverBound(f"makes a value of {size} {unit} ({over})")

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "+", "**"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "*":
                for seq, times in ((left, right), (right, left)):
                    size = sized(seq)
                    if (
                        size is not None
                        and isinstance(times, int)
                        and size * times > (MAX_PROMPT_BYTES)
                    ):
                        raise made(size * times, seq)
                if _is_int(left) and _is_int(right):
                    bits = left.bit_length() + right.bit_length()
                    if bits > MAX_INT_BITS:
                        raise _OverBound(f"makes an integer of about {bits} bits ({over})")
            elif operator == "+":
                a, b = sized(left), sized(right)
                if a is not None and b is not None and a + b > MAX_PROMPT_BYTES:
                    raise made(a + b, left)
            elif operator == "**" and _is_int(left) and _is_int(right) and right > 0:
                bits = max(left.bit_length(), 1) * right
                if abs(left) > 1 and bits > MAX_INT_BITS:
                    raise _OverBound(f"makes an integer of about {bits} bits ({over})")
            return super().call_binop(context, operator, left, right)

    class Generation(jinja2.ext.Extension):
        """transformers' ``{% generation %}`` tag: its body, rendered as it is."""

        tags = {"generation"}  # noqa: RUF012 (jinja2 declares it a set)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(
                lineno
            )

        def _body(self, caller: Any) -> Any:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format: str) -> str:
        return datetime.datetime.now().strftime(format)

    env = BoundedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _template_line(exc: BaseException) -> int | None:
    """The template line an exception was raised at (jinja2 rewrites a template's frames to
    its own lines, as ``<template>``)."""
    if isinstance(exc, _OverBound) and exc.template_line is not None:
        return exc.template_line
    lineno = getattr(exc, "lineno", None)
    if isinstance(lineno, int):
        return lineno
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _answer(out: Any, answer: JsonObject) -> None:
    out.write(json.dumps(answer).encode("ascii") + b"\n")
    out.flush()


def _failure(exc: BaseException) -> JsonObject:
    import jinja2

    line = _template_line(exc)
    if isinstance(exc, _Deadline):
        message = f"used more than its bound of {TEMPLATE_SECONDS:g} s of CPU time"
    elif isinstance(exc, _OverBound):
        message = str(exc)
    elif isinstance(exc, MemoryError):
        message = f"needs more memory than its bound of {size_text(TEMPLATE_MEMORY_BYTES)}"
    elif isinstance(exc, RecursionError):
        message = "recursed deeper than Python allows"
    else:
        kind = "refused" if isinstance(exc, jinja2.TemplateError) else "error"
        text = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
        if kind == "error":
            text = f"{exc.__class__.__name__}: {text}"
        return {"kind": "refused", "message": one_line(text)[:500], "line": line}
    return {"kind": "bound", "message": message, "line": line}


def _render(template: Any, variables: Mapping[str, JsonValue], messages: list[Any]) -> str:
    chunks: list[str] = []
    size = 0
    over = _OverBound(f"renders more than its output bound of {size_text(MAX_PROMPT_BYTES)}")
    generator = template.generate(
        **variables, messages=messages, tools=None, documents=None, add_generation_prompt=True
    )
    for chunk in generator:
        size += len(chunk)
        if size > MAX_PROMPT_BYTES:
            over.template_line = _suspended_line(template, generator)
            raise over
        chunks.append(chunk)
    text = "".join(chunks)
    if len(text.encode("utf-8", "surrogatepass")) > MAX_PROMPT_BYTES:
        raise over
    return text


def _suspended_line(template: Any, generator: Any) -> int | None:
    """The template line a rendering generator is suspended at (after a yield)."""
    while getattr(generator, "gi_yieldfrom", None) is not None:
        generator = generator.gi_yieldfrom
    frame = getattr(generator, "gi_frame", None)
    if frame is None or frame.f_code.co_filename != "<template>":
        return None
    line: int = template.get_corresponding_lineno(frame.f_lineno)
    return line


def _limit_memory() -> None:
    import resource

    try:
        with open("/proc/self/statm") as statm:
            now = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = now + TEMPLATE_MEMORY_BYTES
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (OSError, ValueError):  # no /proc (not Linux): the CPU timer and the checks remain
        pass


def _on_cpu_timer(signum: int, frame: object) -> None:
    raise _Deadline


def _armed(seconds: float) -> None:
    """``SIGPROF`` after ``seconds`` of this process's CPU time (user and system: a bomb that
    only allocates spends its time in the kernel); 0 disarms it."""
    signal.setitimer(signal.ITIMER_PROF, seconds)


def child_main() -> int:
    """The child: the first line of stdin is ``{"template", "variables"}``, each later line
    ``{"messages"}``; each gets one answer line: ``{"text"}`` or ``{"kind", "message",
    "line"}`` (the first answer, to the template, is ``{"text": ""}`` when it compiled)."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    signal.signal(signal.SIGPROF, _on_cpu_timer)
    env = _bounded_environment()
    first = json.loads(stdin.readline())
    variables = first["variables"]
    _limit_memory()
    try:
        _armed(TEMPLATE_SECONDS)
        template = env.from_string(first["template"])
        _armed(0)
    except BaseException as exc:  # every failure is one answer
        _armed(0)
        _answer(stdout, _failure(exc))
        return 0
    _answer(stdout, {"text": ""})
    for line in stdin:
        messages = json.loads(line)["messages"]
        try:
            _armed(TEMPLATE_SECONDS)
            text = _render(template, variables, messages)
            _armed(0)
        except BaseException as exc:  # every failure is one answer
            _armed(0)
            _answer(stdout, _failure(exc))
            return 0
        _answer(stdout, {"text": text})
    return 0


def render_all(
    template: str,
    variables: Mapping[str, JsonValue],
    template_file: Path | str,
    chats: Sequence[tuple[str, Sequence[Mapping[str, str]]]],
) -> Iterator[str]:
    """Each of ``chats`` (where, messages) rendered, in order (one child for all of them)."""
    with ChatRenderer(template, variables, template_file) as renderer:
        for where, messages in chats:
            yield renderer.render(messages, where)


if __name__ == "__main__":
    raise SystemExit(child_main())
