"""CLI commands as processes, forked from one server that imported the CLI once.

Owns the client of ``tests/cli_fork_server.py``: ``ForkServer`` (one server process; each call runs
``logprob-drift ARGV`` as a child forked from it, under a CPU-time and an address-space bound) and
``Finished`` (what the child did: exit code or signal, stdout, stderr, wall time, CPU time, peak
resident growth). ``tests/conftest.py`` exposes one server per test process (per xdist worker) as
the session fixture ``cli_process``, for ``process`` tests only: started at the first test that asks
for it, closed at the end of the session.

Use it where a test needs a command as a process for its bounds (a hang ended by a timer, a
read without end by ``RLIMIT_AS``), its real standard streams or its argv, and many such
commands (a property test's examples): a child starts in milliseconds where
``python -m pytest_logprob_drift`` spends seconds importing torch and transformers. A test that
asks only for an exit code and the streams runs the command in process
(``drift_testing.cli``); tests about the process start itself (which modules get imported, the
entry point, installed entry points) start a real interpreter.

The child's environment is the one a ``subprocess`` started now would inherit (this process's
``os.environ``, with the server's ``OMP_NUM_THREADS=1`` and ``PYTHONPATH`` kept) plus the call's
``env`` (None: removed); its working directory is ``cwd`` (default: this process's). The
server's own stderr goes to ``server.err`` in its scratch directory (named when it ends).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from drift_testing import ROOT

SERVER = ROOT / "tests" / "cli_fork_server.py"
DEFAULT_SECONDS = 120.0
"""CPU-time bound of a command unless the call states its own (its wall-time backstop is ten
times as long): far above any command of the suite; a loop without end still ends."""
DEFAULT_MEMORY_BYTES = 4 << 30
"""Address-space growth a command may have unless the call states its own."""
_KEPT = frozenset({"OMP_NUM_THREADS", "PYTHONPATH"})
"""Set by the server (one torch thread for fork safety; this checkout first on the path, where
the child's own subprocesses, such as the chat template renderer, import the package from); a
child keeps the server's value unless the call's ``env`` names it."""


@dataclass(frozen=True)
class Finished:
    """A command that ran as a forked child."""

    argv: tuple[str, ...]
    code: int | None
    """The exit code (None: killed by ``signal``)."""
    signal: int | None
    wall_s: float
    cpu_s: float
    """The child's user and system CPU time (what its time bound counts)."""
    rss_growth_bytes: int
    """The peak resident set above the one at the fork (-1: killed before it could say)."""
    children_rss_bytes: int
    """The largest peak resident set of a process the command started and waited for (the
    chat template renderer; 0: none; -1: killed before it could say)."""
    stdout_bytes: bytes
    stderr_bytes: bytes

    @property
    def returncode(self) -> int | None:
        return self.code

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode(errors="replace")

    def describe(self) -> str:
        return (
            f"{' '.join(self.argv)}: code {self.code} signal {self.signal} "
            f"{self.wall_s:.1f}s ({self.cpu_s:.1f}s CPU) +{self.rss_growth_bytes >> 20} MiB\n"
            f"--- stdout ---\n{self.stdout[-3000:]}\n--- stderr ---\n{self.stderr[-3000:]}"
        )


def _arg(arg: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> str:
    """What ``sys.argv`` holds for ``arg`` in a process it is passed to."""
    return os.fsdecode(arg)


class ForkServer:
    """``tests/cli_fork_server.py``: each command a forked child under the stated bounds."""

    def __init__(
        self,
        scratch: Path,
        *,
        seconds: float = DEFAULT_SECONDS,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
    ) -> None:
        self.scratch = scratch
        self.environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        self.errors = scratch / "server.err"
        with self.errors.open("wb") as errors:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    str(SERVER),
                    "--memory-bytes",
                    str(memory_bytes),
                    "--seconds",
                    str(seconds),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                stderr=errors,
                env=self.environment,
                cwd=scratch,
            )
        self.ready = False
        self.count = 0

    def _await_ready(self) -> None:
        """Wait, once, for the server's imports to finish (at its first command)."""
        if self.ready:
            return
        assert self.process.stdout is not None
        ready = self.process.stdout.readline()
        assert ready, f"the fork server did not start:\n{self.errors.read_text()[-3000:]}"
        assert json.loads(ready) == {"ready": True}
        self.ready = True

    def _environment(self, env: Mapping[str, str | None]) -> dict[str, str | None]:
        """What to change in the server's environment: this process's now, then ``env``."""
        wanted: dict[str, str | None] = {
            k: v for k, v in os.environ.items() if k not in _KEPT and self.environment.get(k) != v
        }
        wanted.update({k: None for k in self.environment if k not in os.environ and k not in _KEPT})
        wanted.update(env or {})
        return wanted

    def __call__(
        self,
        *argv: str | bytes | os.PathLike[str] | os.PathLike[bytes],
        env: Mapping[str, str | None] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        seconds: float | None = None,
        memory_bytes: int | None = None,
    ) -> Finished:
        """``logprob-drift ARGV`` as a child: ``env`` set (None: removed) in its environment,
        in ``cwd``, bounded by ``seconds`` of CPU time (ten times as much wall time: a child
        blocked for ever still ends) and ``memory_bytes`` of address space above the server's
        (else the server's bounds)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self._await_ready()
        self.count += 1
        out = self.scratch / f"{self.count}.out"
        err = self.scratch / f"{self.count}.err"
        args = tuple(_arg(a) for a in argv)
        request = {
            "argv": list(args),
            "stdout": str(out),
            "stderr": str(err),
            "env": self._environment(env),
            "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
            "seconds": seconds,
            "memory_bytes": memory_bytes,
        }
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"the fork server ended:\n{self.errors.read_text()[-3000:]}"
        reply = json.loads(line)
        finished = Finished(
            argv=args,
            code=reply["code"],
            signal=reply["signal"],
            wall_s=reply["wall_s"],
            cpu_s=reply["cpu_s"],
            rss_growth_bytes=-1 if reply["rss_growth_bytes"] is None else reply["rss_growth_bytes"],
            children_rss_bytes=(
                -1 if reply["children_rss_bytes"] is None else reply["children_rss_bytes"]
            ),
            stdout_bytes=out.read_bytes(),
            stderr_bytes=err.read_bytes(),
        )
        out.unlink()
        err.unlink()
        return finished

    def warm(self, *argv: str | Path) -> int:
        """Run a command in the server itself (its caches are inherited by every child)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self._await_ready()
        self.process.stdin.write(json.dumps({"warm": [str(a) for a in argv]}) + "\n")
        self.process.stdin.flush()
        code: int = json.loads(self.process.stdout.readline())["code"]
        return code

    def close(self) -> None:
        assert self.process.stdin is not None
        if not self.ready:  # never used: no need to let it finish its imports
            self.process.kill()
        self.process.stdin.close()
        self.process.wait(timeout=60)
        if self.process.stdout is not None:
            self.process.stdout.close()


class Bounded:
    """Commands of one test module on the shared ``ForkServer``, each under the module's own
    bounds, with the worst wall time and resident growth seen per command (``worst``)."""

    def __init__(self, server: ForkServer, scratch: Path, *, seconds: float, memory_bytes: int):
        self.server = server
        self.scratch = scratch
        self.seconds = seconds
        self.memory_bytes = memory_bytes
        self.count = 0
        self.worst: dict[str, tuple[float, int]] = {}

    def __call__(self, *argv: str | os.PathLike[str]) -> Finished:
        self.count += 1
        finished = self.server(*argv, seconds=self.seconds, memory_bytes=self.memory_bytes)
        wall, rss = self.worst.get(finished.argv[0], (0.0, 0))
        self.worst[finished.argv[0]] = (
            max(wall, finished.wall_s),
            max(rss, finished.rss_growth_bytes),
        )
        return finished

    def warm(self, *argv: str | Path) -> int:
        return self.server.warm(*argv)


@contextmanager
def bounded(
    server: ForkServer, scratch: Path, *, seconds: float, memory_bytes: int
) -> Iterator[Bounded]:
    """A module's ``Bounded`` commands on ``server``; at the end, the worst wall time and
    resident growth of each command are printed (shown with ``-s``)."""
    serving = Bounded(server, scratch, seconds=seconds, memory_bytes=memory_bytes)
    yield serving
    for command, (wall, rss) in sorted(serving.worst.items()):
        print(f"{command}: at most {wall:.1f} s, {rss / 2**20:+.0f} MiB resident")
