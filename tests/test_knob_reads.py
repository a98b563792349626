"""No module of ``runtimes/``, ``plan/`` or ``execute/`` reads a knob's value with a default of
its own (issue 49): engines read typed settings (``execute.side_settings``), planning reads
``plan.knobs.value_of`` (the catalog's default).

A knob read is a ``.get(KEY, ...)`` whose KEY is a catalog path (``rollout.dtype``) or its
field (``dtype``, ``batch_size``), as a string literal or a module constant bound to one, on
the requested knobs or a side's named knobs (the receiver's last name is ``requested``,
``rollout`` or ``training``). Other ``.get`` calls keyed by a knob's name (evidence,
read-backs, reports) are not knob reads. ``python tests/test_knob_reads.py`` prints both lists
(of the package beside it: run a copy of this file in an older tree to count there).
"""

from __future__ import annotations

import ast
from pathlib import Path

from pytest_logprob_drift.plan.knobs import KNOBS

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_logprob_drift"
KNOB_MAPPINGS = ("requested", "rollout", "training")


def knob_keyed_reads() -> tuple[list[str], list[str]]:
    """(knob reads, other reads keyed by a knob's name), as ``file:line: call``."""
    # Paths, and the names a side's mapping or settings give them (``dtype``, ``batch_size``).
    keys = set(KNOBS) | {p.split(".", 1)[1] for p in KNOBS} | {p.replace(".", "_") for p in KNOBS}
    reads: list[str] = []
    others: list[str] = []
    for folder in ("runtimes", "plan", "execute"):
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            constants = {
                target.id: node.value.value
                for node in tree.body
                if isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
                for target in node.targets
                if isinstance(target, ast.Name)
            }
            for node in ast.walk(tree):
                if not (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "get"
                    and node.args
                ):
                    continue
                key = node.args[0]
                if isinstance(key, ast.Constant):
                    name = key.value
                elif isinstance(key, ast.Name):
                    name = constants.get(key.id)
                else:
                    continue
                if name not in keys:
                    continue
                where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}"
                receiver = ast.unparse(node.func.value).split(".")[-1]
                (reads if receiver in KNOB_MAPPINGS else others).append(where)
    return reads, others


def test_no_module_reads_a_knob_with_a_default_of_its_own() -> None:
    reads, others = knob_keyed_reads()
    assert reads == []
    assert others  # the scan sees the package (evidence and read-backs keyed by knob name)


if __name__ == "__main__":
    found, apart = knob_keyed_reads()
    print(f"knob reads: {len(found)}", *found, sep="\n")
    print(f"other reads keyed by a knob's name: {len(apart)}", *apart, sep="\n")
