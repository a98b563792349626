"""A process that runs ``logprob-drift`` commands, each in a forked child under resource bounds.

Test support for every test that runs a CLI command as a process where the process start is not what
it proves (the client, and the session fixture ``cli_process``, are ``tests/cli_processes.py``):
importing torch, matplotlib, transformers' ``AutoTokenizer`` and the command modules takes seconds,
running one command on a small input a fraction of one, so this server imports them once and forks a
child per command. The child is the CLI process of that command: its stdin is ``/dev/null``, its
stdout and stderr go to files, its environment and working directory are those of the request (the
standard streams follow its ``PYTHONIOENCODING``, as at an interpreter's start), its address space
is capped (``RLIMIT_AS``: the server's own plus ``memory_bytes``), an interval timer kills it
(``SIGPROF``) after ``seconds`` of its CPU time, and another (``SIGALRM``) after ``WALL_BACKSTOP``
times as much wall time (a child blocked for ever: a FIFO nobody opens), and it ends the way
``python -m pytest_logprob_drift`` ends: the exit code ``main`` returns (``SystemExit`` from
argparse), or a Python traceback on stderr and exit 1 for an exception that escapes (what the
interpreter does); then the ``atexit`` handlers run and the standard streams are flushed. The server
runs torch with one thread (``OMP_NUM_THREADS=1``, so no thread pool is inherited half-started by a
child) and may run a command once itself (``warm``: matplotlib's caches, which every child then
inherits).

What a child does not see the way a fresh interpreter does: anything read from the environment
at import time by the modules imported here (the request's ``env`` is set before ``main``, after
the imports), and ``sys.modules`` (everything above is already imported). Tests about those
start a real process.

Protocol: one JSON object per line on stdin, one per line on stdout back.

- ``{"argv", "stdout", "stderr"}`` (file paths), optionally ``env`` (name -> value, or None to
  remove it, in the child only), ``cwd``, ``seconds`` (a float) and ``memory_bytes`` (else the
  server's ``--seconds`` and ``--memory-bytes``). ``argv`` holds what ``sys.argv[1:]`` would: a path
  that is not UTF-8 as ``os.fsdecode`` gives it (lone surrogates, which JSON carries as ``\\udcXX``
  escapes). Answered with ``code`` (None when killed), ``signal``, ``wall_s``, ``cpu_s`` (the
  child's user and system CPU time), ``rss_growth_bytes`` (the child's peak resident set, ``VmHWM``,
  above its resident set at the fork; None when it was killed) and ``children_rss_bytes`` (the
  largest peak resident set of a process the child started and waited for, e.g. the chat template
  renderer; 0 when none; None when it was killed).
- ``{"warm": argv}``: run in the server itself, answered with its ``code``.
"""

from __future__ import annotations

import argparse
import atexit
import io
import json
import os
import resource
import signal
import sys
import time
import traceback
from typing import Any

WALL_BACKSTOP = 10
"""How many times its CPU-time bound a child may take in wall time: a backstop for a child that
waits without using CPU; on a machine shared with other work a busy child gets a fraction of a
core, so its wall time is a multiple of its CPU time."""


def _address_space() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _resident() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_resident() -> int:
    """This process's peak resident set so far (``VmHWM``), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _standard_streams(setting: str | None) -> None:
    """The standard streams as an interpreter started with ``PYTHONIOENCODING=setting`` has
    them (``ENCODING[:ERRORS]``; stderr keeps ``backslashreplace``); unset: the server's."""
    if not setting:
        return
    encoding, _, errors = setting.partition(":")
    for stream in (sys.stdout, sys.stderr):
        assert isinstance(stream, io.TextIOWrapper)
        stream.reconfigure(
            encoding=encoding or None,
            errors=(errors or None) if stream is sys.stdout else "backslashreplace",
        )


def _child(request: dict[str, Any], memory: int, seconds: float) -> None:
    code = 1
    start = _resident()
    stdout: str = request["stdout"]
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in (null, out, err):
            os.close(fd)
        for name, value in (request.get("env") or {}).items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if request.get("cwd") is not None:
            os.chdir(request["cwd"])
        _standard_streams(os.environ.get("PYTHONIOENCODING"))
        limit = _address_space() + int(request.get("memory_bytes") or memory)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        bound = float(request.get("seconds") or seconds)
        for number in (signal.SIGPROF, signal.SIGALRM):
            signal.signal(number, signal.SIG_DFL)
        signal.setitimer(signal.ITIMER_PROF, bound)
        signal.setitimer(signal.ITIMER_REAL, bound * WALL_BACKSTOP)
        from pytest_logprob_drift.cli import main

        argv: list[str] = request["argv"]
        sys.argv = ["logprob-drift", *argv]
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse; what the interpreter does with the others
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:  # what the interpreter does with an exception that escapes
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
            with open(f"{stdout}.rss", "w") as growth:
                growth.write(f"{_peak_resident() - start} {children}")
        finally:
            os._exit(code)


def serve(memory: int, seconds: float) -> None:
    # What the commands import, imported once here.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot
    import torch  # noqa: F401
    from transformers import AutoTokenizer  # noqa: F401

    import pytest_logprob_drift.cli.import_cmd
    import pytest_logprob_drift.cli.init_cmd
    import pytest_logprob_drift.cli.plan_cmd
    import pytest_logprob_drift.cli.prompts_cmd
    import pytest_logprob_drift.cli.report_cmd
    import pytest_logprob_drift.cli.run_cmd
    import pytest_logprob_drift.cli.verify_cmd
    import pytest_logprob_drift.report.plots  # noqa: F401
    from pytest_logprob_drift.cli import main

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if "warm" in request:  # run once here: caches (fonts, mathtext) the children inherit
            with open(os.devnull, "w") as devnull:
                code = main(request["warm"], out=devnull, err=devnull)
            print(json.dumps({"code": code}), flush=True)
            continue
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(request, memory, seconds)
        _, status, usage = os.wait4(pid, 0)
        wall_s = time.monotonic() - start
        rss_growth: int | None = None
        children_rss: int | None = None
        try:
            with open(f"{request['stdout']}.rss") as growth:
                rss_growth, children_rss = map(int, growth.read().split())
        except (OSError, ValueError):  # killed before it could say
            pass
        try:
            os.unlink(f"{request['stdout']}.rss")
        except OSError:
            pass
        reply = {
            "code": os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "wall_s": wall_s,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "rss_growth_bytes": rss_growth,
            "children_rss_bytes": children_rss,
        }
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--memory-bytes", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    options = parser.parse_args()
    serve(options.memory_bytes, options.seconds)  # returns when the client closes stdin
