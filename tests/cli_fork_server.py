"""A process that runs ``logprob-drift`` commands, each in a forked child under resource bounds.

Test support for the hostile-input property test (``test_hardening_sealed_fuzz``): importing
torch and the package takes seconds, running one command on a small run a fraction of one, so
this server imports them once and forks a child per command. The child is the CLI process of
that command: its stdout and stderr go to files, its address space is capped
(``RLIMIT_AS``: the server's own plus ``--memory-bytes``), an alarm kills it after
``--seconds``, and it ends the way ``python -m pytest_logprob_drift`` ends: the exit code
``main`` returns, or a Python traceback on stderr and exit 1 for an exception that escapes
(what the interpreter does). The server runs torch with one thread (``OMP_NUM_THREADS=1``, so no
thread pool is inherited half-started by a child) and may run a command once itself (``warm``:
matplotlib's font and mathtext caches, which every child then inherits).

Protocol: one JSON object per line on stdin (``argv``, ``stdout``, ``stderr``: file paths; or
``warm``: an argv run in the server, answered with its ``code``),
one per line on stdout back: ``code`` (None when killed), ``signal``, ``wall_s`` and
``rss_growth_bytes`` (the child's peak resident set, ``VmHWM``, above its resident set at the
fork; None when it was killed).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
import time
import traceback


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


def _child(argv: list[str], stdout: str, stderr: str, memory: int, seconds: int) -> None:
    code = 1
    start = _resident()
    try:
        out = os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(err, 2)
        limit = _address_space() + memory
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(seconds)
        from pytest_logprob_drift.cli import main

        sys.argv = ["logprob-drift", *argv]
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # what the interpreter does with an exception that escapes
            traceback.print_exc()
            code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            with open(f"{stdout}.rss", "w") as growth:
                growth.write(str(_peak_resident() - start))
        finally:
            os._exit(code)


def serve(memory: int, seconds: int) -> None:
    # What the commands import, imported once here.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot
    import torch  # noqa: F401

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
            _child(request["argv"], request["stdout"], request["stderr"], memory, seconds)
        _, status = os.waitpid(pid, 0)
        try:
            with open(f"{request['stdout']}.rss") as growth:
                rss_growth = int(growth.read())
            os.unlink(f"{request['stdout']}.rss")
        except (OSError, ValueError):  # killed before it could say
            rss_growth = None
        reply = {
            "code": os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "wall_s": time.monotonic() - start,
            "rss_growth_bytes": rss_growth,
        }
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--memory-bytes", type=int, required=True)
    parser.add_argument("--seconds", type=int, required=True)
    options = parser.parse_args()
    serve(options.memory_bytes, options.seconds)
