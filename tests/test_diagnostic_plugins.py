"""Diagnostics as plugins (issue 51): a diagnostic defined only in the test tree
(``tests/log_ratio_peak``, installed here) is computed, sealed, checked by verify, and shown
in the run table, the report's table, text and page, and a part sealed by a diagnostic not
installed is refused as such; the hubs name no single diagnostic (their imports read with
``ast``).

One real cpu-smoke run of the S0 experiment with the test diagnostic installed; its figures
are recomputed here in float64 with plain Python from the sealed token_diffs.pt.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import OFFSET_EXPECT, REPO, S0, cli
from log_ratio_peak import DIAGNOSTIC
from log_ratio_peak.diagnostic import FILE, LogRatioPeak

from pytest_logprob_drift.diagnostics import registry
from pytest_logprob_drift.numerics.comparison import Diagnostics, from_builtins
from pytest_logprob_drift.store.files import json_bytes
from pytest_logprob_drift.store.layout import COMPARISON, COMPLETE, SCORE_ROLLOUT, TOKEN_DIFFS
from pytest_logprob_drift.store.run import iter_attempt_dirs
from pytest_logprob_drift.tensorio import tensor_bytes, tensors_from_bytes

pytest_plugins = ["pytester"]

EXPERIMENT = "s0-cpu-smoke"
NAME = "log_ratio_peak"


@pytest.fixture(scope="module")
def installed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The S0 run executed with the test diagnostic installed: its run directory and the run
    command's table output. The diagnostic is uninstalled once the run is done (a test that
    reads with it installed asks for ``plugin_installed``)."""
    artifacts = tmp_path_factory.mktemp("diagnostic-plugin") / "runs"
    registry.install(DIAGNOSTIC)
    try:
        code, out, err = cli(
            "run",
            S0,
            "--runtime",
            "cpu-smoke",
            "--allow-smoke-operators",
            "--expect",
            OFFSET_EXPECT,
            "--artifacts",
            artifacts,
        )
    finally:
        registry.uninstall(NAME)
    assert code == 0, out + err
    return artifacts / EXPERIMENT, out


@pytest.fixture
def plugin_installed(installed_run: tuple[Path, str]) -> Iterator[None]:
    registry.install(DIAGNOSTIC)
    try:
        yield
    finally:
        registry.uninstall(NAME)


def _comparisons(run_dir: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    out = {}
    for attempt in iter_attempt_dirs(run_dir):
        document = json.loads((attempt / COMPARISON).read_bytes())
        out[document["label"]] = (attempt, document)
    return out


def _by_hand(attempt: Path) -> tuple[float, int, int]:
    """(largest r over active tokens, its sample, its position) from token_diffs.pt."""
    diffs = tensors_from_bytes((attempt / TOKEN_DIFFS).read_bytes())
    training = diffs["training_logprobs"].to(torch.float64).tolist()
    rollout = diffs["rollout_logprobs"].to(torch.float64).tolist()
    active = diffs["active_mask"].tolist()
    best: tuple[float, int, int] | None = None
    for i, row in enumerate(active):
        for j, on in enumerate(row):
            r = training[i][j] - rollout[i][j]
            if on and (best is None or r > best[0]):
                best = (r, i, j)
    assert best is not None
    return best


def _reseal(attempt: Path, document: dict[str, Any]) -> None:
    path = attempt / COMPARISON
    os.chmod(path, 0o644)
    path.write_bytes(json_bytes(document))
    seal = json.loads((attempt / COMPLETE).read_text())
    seal["files"][COMPARISON] = hashlib.sha256(path.read_bytes()).hexdigest()
    os.chmod(attempt / COMPLETE, 0o644)
    (attempt / COMPLETE).write_bytes(json_bytes(seal))


def test_the_part_is_sealed_beside_the_declared_ones_and_equals_a_recomputation(
    installed_run: tuple[Path, str],
) -> None:
    run_dir, _ = installed_run
    cases = _comparisons(run_dir)
    assert len(cases) == 3
    for label, (attempt, document) in cases.items():
        assert "importance_sampling" in document["diagnostics"], label  # built-in kept
        assert "installed_parts" not in document["diagnostics"], label
        part = document["diagnostics"][NAME]
        r, sample, position = _by_hand(attempt)
        sampled = tensors_from_bytes((attempt / SCORE_ROLLOUT).read_bytes())["token_ids"]
        token_id = int(sampled[sample, position])
        expected = {"log_ratio": r, "sample": sample, "position": position, "token_id": token_id}
        assert part == expected, label


def test_the_run_table_shows_its_column(installed_run: tuple[Path, str]) -> None:
    run_dir, out = installed_run
    header = next(line for line in out.splitlines() if line.startswith("case_id"))
    assert header.rstrip().endswith("peak r"), header
    for label, (attempt, document) in _comparisons(run_dir).items():
        row = next(line for line in out.splitlines() if line.startswith(document["case_id"]))
        r, sample, position = _by_hand(attempt)
        assert row.split()[-1] == f"{r:.6g}", row
        assert f"{label}: log-ratio peak at {sample}:{position}" in out


def test_the_file_is_sealed_and_equals_a_recomputation(installed_run: tuple[Path, str]) -> None:
    run_dir, _ = installed_run
    for label, (attempt, _) in _comparisons(run_dir).items():
        sealed = tensors_from_bytes((attempt / FILE).read_bytes())["log_ratio"].tolist()
        diffs = tensors_from_bytes((attempt / TOKEN_DIFFS).read_bytes())
        training = diffs["training_logprobs"].to(torch.float64).tolist()
        rollout = diffs["rollout_logprobs"].to(torch.float64).tolist()
        for i, row in enumerate(diffs["active_mask"].tolist()):
            for j, on in enumerate(row):
                expected = training[i][j] - rollout[i][j] if on else -math.inf
                assert sealed[i][j] == expected, (label, i, j)
        assert FILE in json.loads((attempt / COMPLETE).read_text())["files"], label


def test_verify_names_a_tampered_sealed_file(
    installed_run: tuple[Path, str], plugin_installed: None, tmp_path: Path
) -> None:
    run_dir, _ = installed_run
    runs = tmp_path / "runs"
    shutil.copytree(run_dir, runs / EXPERIMENT)
    attempt, _ = _comparisons(runs / EXPERIMENT)["batch.size=1"]
    path = attempt / FILE
    tensors = tensors_from_bytes(path.read_bytes())
    ratio = tensors["log_ratio"]
    ratio[torch.isfinite(ratio)] += 1.0  # the active tokens
    os.chmod(path, 0o644)
    path.write_bytes(tensor_bytes(tensors))
    seal = json.loads((attempt / COMPLETE).read_text())
    seal["files"][FILE] = hashlib.sha256(path.read_bytes()).hexdigest()
    os.chmod(attempt / COMPLETE, 0o644)
    (attempt / COMPLETE).write_bytes(json_bytes(seal))
    code, out, err = cli("verify", runs / EXPERIMENT)
    assert (code, err) == (1, ""), out
    (line,) = [line for line in out.splitlines() if line.startswith(attempt.parent.name)]
    assert f"invalid  {FILE}  log_ratio differs from token_diffs.pt" in line, line


def test_verify_checks_the_part_and_names_a_tampered_figure(
    installed_run: tuple[Path, str], plugin_installed: None, tmp_path: Path
) -> None:
    run_dir, _ = installed_run
    code, out, err = cli("verify", run_dir)
    assert (code, err) == (0, ""), out

    runs = tmp_path / "runs"
    shutil.copytree(run_dir, runs / EXPERIMENT)
    attempt, document = _comparisons(runs / EXPERIMENT)["baseline"]
    document["diagnostics"][NAME]["position"] += 1
    _reseal(attempt, document)
    code, out, err = cli("verify", runs / EXPERIMENT)
    assert (code, err) == (1, ""), out
    lines = [line for line in out.splitlines() if line.startswith(attempt.parent.name)]
    assert len(lines) == 1 and "invalid" in lines[0], out
    assert f"diagnostics.{NAME}.position differs from token_diffs.pt" in lines[0], lines[0]

    document["diagnostics"][NAME]["position"] -= 1  # back to what was sealed
    document["diagnostics"][NAME]["token_id"] += 1  # not the token the engine sampled there
    _reseal(attempt, document)
    code, out, err = cli("verify", runs / EXPERIMENT)
    assert (code, err) == (1, ""), out
    assert f"diagnostics.{NAME}.token_id differs from {SCORE_ROLLOUT}" in out, out

    document["diagnostics"][NAME]["position"] = "first"
    _reseal(attempt, document)
    code, out, _ = cli("verify", runs / EXPERIMENT)
    assert code == 1
    assert f"$.diagnostics.{NAME}.position: Expected `int`, got `str`" in out, out


def test_a_part_of_a_diagnostic_not_installed_is_named_not_tampered(
    installed_run: tuple[Path, str],
) -> None:
    run_dir, _ = installed_run
    assert registry.by_name(NAME) is None
    code, out, err = cli("verify", run_dir)
    assert (code, err) == (1, ""), out
    case_ids = {document["case_id"] for _, document in _comparisons(run_dir).values()}
    refused = [line for line in out.splitlines() if line.split(" ")[0] in case_ids]
    assert len(refused) == 3, out
    attribution = [line for line in out.splitlines() if line.startswith("attribution ")]
    assert len(attribution) == 1, out
    for line in [*refused, *attribution]:
        assert "invalid" in line, line
        assert f"sealed by diagnostic {NAME}, not installed here" in line, line
        assert "tamper" not in line, line


@pytest.mark.slow
def test_the_report_shows_its_column_section_and_lines(
    installed_run: tuple[Path, str], plugin_installed: None, tmp_path: Path
) -> None:
    run_dir, _ = installed_run
    runs = tmp_path / "runs"
    shutil.copytree(run_dir, runs / EXPERIMENT)
    page = tmp_path / "page.html"
    code, out, err = cli("report", runs / EXPERIMENT, "--html", page, "--json")
    assert code == 0, err
    cases = {c["label"]: c for c in json.loads(out)["cases"]}
    html = page.read_text()
    for label, (attempt, _) in _comparisons(runs / EXPERIMENT).items():
        r, sample, position = _by_hand(attempt)
        sampled = tensors_from_bytes((attempt / SCORE_ROLLOUT).read_bytes())["token_ids"]
        assert cases[label]["diagnostics"][NAME] == {
            "log_ratio": r,
            "sample": sample,
            "position": position,
            "token_id": int(sampled[sample, position]),
        }
        assert f"r = {r!r} at sample {sample}, position {position}" in html
    assert html.count("<h3>Log-ratio peak</h3>") == len(cases)
    assert "<th class='more'>peak r</th>" in html
    # Its run-scope part (``report_run_section`` / ``report_run_lines``), with no hub changed.
    r, label = max((_by_hand(a)[0], k) for k, (a, _) in _comparisons(runs / EXPERIMENT).items())
    peak = f"r = {r!r} ({label})"
    run_section = f"<section id='{NAME}-run'><h2>Log-ratio peaks, every case</h2><p>{peak}</p>"
    assert html.count(run_section) == 1, html
    assert html.index(run_section) > html.index("id='findings'")
    code, out, err = cli("report", runs / EXPERIMENT, "--html", tmp_path / "text.html")
    assert code == 0, err
    assert f"largest log-ratio peak over every case: {peak}" in out.splitlines(), out
    code, out, err = cli("report", runs / EXPERIMENT, "--html", page, "--verbose")
    assert code == 0, err
    assert "peak r" in next(line for line in out.splitlines() if line.startswith("case_id"))
    for label, (attempt, _) in _comparisons(runs / EXPERIMENT).items():
        _, sample, position = _by_hand(attempt)
        assert f"{label}: log-ratio peak at {sample}:{position}" in out


def test_the_plugin_records_its_property_and_failure_line(pytester: pytest.Pytester) -> None:
    """The plugin's junit properties and failure text (pytest in this process, so the
    diagnostic installed here is installed there)."""
    shutil.copy(S0, pytester.path / S0.name)
    registry.install(DIAGNOSTIC)
    try:
        result = pytester.runpytest(
            "--drift-config",
            S0.name,
            "--drift-runtime",
            "cpu-smoke",
            "--drift-allow-smoke-operators",
            "--junitxml",
            "out.xml",
        )
    finally:
        registry.uninstall(NAME)
    result.assert_outcomes(passed=2, failed=1)
    root = ET.parse(pytester.path / "out.xml").getroot()
    for case in root.iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        r, sample, position = _by_hand(Path(str(props["drift_attempt"])))
        assert props[f"drift_{NAME}"] == repr(r), case.get("name")
        assert "drift_is_ess" in props  # the built-in diagnostic's properties stay
    failing = next(c for c in root.iter("testcase") if c.find("failure") is not None)
    attempt = next(
        str(p.get("value")) for p in failing.iter("property") if p.get("name") == "drift_attempt"
    )
    _, sample, position = _by_hand(Path(attempt))
    assert f"log-ratio peak at {sample}:{position}" in result.stdout.str()


# ---- the hubs name no diagnostic ------------------------------------------------------------

HUBS = (
    "execute/case.py",
    "check/resume.py",
    "store/comparison.py",
    "comparison_record.py",
    "report/load.py",
    "report/html.py",
    "report/columns.py",
    "report/summary.py",
    "cli/run_cmd.py",
    "cli/report_cmd.py",
    "plugin/items.py",
    "plugin/reporting.py",
    "attribution/analysis.py",
    "attribution/sealed.py",
)
MOVED = (
    *("importance", "path_split", "replay"),
    *("full_vocab", "divergence", "semantic_offset", "numerics.text"),
)
"""Words naming a diagnostic moved into ``diagnostics/`` (its modules and names; the full
vocabulary's report columns and case section among them)."""
LAYERS = (
    "layer_text",
    "layers_check",
    "layer_reduction",
    "execute.layers",
    "report.layers",
    "diagnostics.layers",
    "attribution.layers",
    "layer_lines",
)
"""Modules of the layers diagnostic (moved into ``diagnostics/layers/``, its attribution
contribution too: ``attribution.analysis`` loops over the installed contributions): no hub
names them (its run-scope section is the protocol's ``report_run_section``; the states' words,
``numerics.layer_states``, shown by ``attribution.text``'s ``layer_properties`` and its tables,
are not the diagnostic's modules)."""
ROUTING_AND_SIGNATURES = (
    "routing_text",
    "routing_check",
    "check_routing_files",
    "execute.routing",
    "routing_diagnostics",
    "report.routing",
    "diagnostics.routing",
    "signature_check",
    "check_signatures",
    "with_signatures",
    "signature_html",
    "signature_section",
    "findings_links",
    "report.signatures",
    "named_signatures",
    "score_signatures",
    "diagnostics.signatures",
)
"""Modules and names of the routing and signatures diagnostics (moved into
``diagnostics/routing/`` and ``diagnostics/signatures/``): no hub names them. Not diagnostics,
so allowed: the rollout's expert choices captured while it generates
(``execute.rollout_experts``: what the training setting ``training.moe_routing=replay`` hands
the scorer, and the routing diagnostic reads through ``CaseUnderCapture``), and the
imported-step check (``check.imported_check`` in ``check/resume.py`` and ``report/load.py``:
an identity check beside the verdict, as the weight check). ``report/summary.py``'s
``report --json`` still lists the named signatures (``report.signatures``, the report's model
that the findings lead with, below the diagnostic folders)."""


def _imports(path: Path) -> list[str]:
    """Every module and name ``path`` imports, dotted (``module.name`` for from-imports)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            out += [f"{node.module}.{alias.name}" for alias in node.names]
    return out


def test_the_hubs_import_no_single_diagnostic() -> None:
    package = REPO / "pytest_logprob_drift"
    for hub in HUBS:
        imports = _imports(package / hub)
        assert imports, hub
        words = MOVED + LAYERS + (() if hub == "report/summary.py" else ROUTING_AND_SIGNATURES)
        named = [i for i in imports if any(word in i.lower() for word in words)]
        assert not named, (hub, named)
        diagnostics = [i for i in imports if i.startswith("pytest_logprob_drift.diagnostics")]
        assert all(
            i.startswith(
                (
                    "pytest_logprob_drift.diagnostics.registry.",
                    "pytest_logprob_drift.diagnostics.protocol.",
                )
            )
            for i in diagnostics
        ), (hub, diagnostics)


def test_the_import_check_sees_a_named_diagnostic(tmp_path: Path) -> None:
    """The check above can fail: a hub importing a moved diagnostic's view is caught."""
    hub = tmp_path / "hub.py"
    hub.write_text("from pytest_logprob_drift.numerics import importance_text\n")
    assert _imports(hub) == ["pytest_logprob_drift.numerics.importance_text"]
    assert any("importance" in i for i in _imports(hub))
    hub.write_text("from pytest_logprob_drift.execute.layers import layer_diagnostics\n")
    assert any(word in i for i in _imports(hub) for word in LAYERS)
    hub.write_text("from pytest_logprob_drift.diagnostics.layers import run_plot\n")
    assert any(word in i for i in _imports(hub) for word in LAYERS)
    hub.write_text("from pytest_logprob_drift.numerics.layer_states import state_words\n")
    assert not any(word in i for i in _imports(hub) for word in LAYERS)
    for planted in (
        "from pytest_logprob_drift.numerics import routing_text\n",
        "from pytest_logprob_drift.execute.routing import routing_diagnostics\n",
        "from pytest_logprob_drift.diagnostics.routing.check import check_routing_files\n",
        "from pytest_logprob_drift.diagnostics.signatures import section\n",
        "from pytest_logprob_drift.report.signatures import named_signatures\n",
    ):
        hub.write_text(planted)
        assert any(word in i for i in _imports(hub) for word in ROUTING_AND_SIGNATURES), planted
    hub.write_text("from pytest_logprob_drift.execute.rollout_experts import arm_rollout\n")
    assert not any(word in i for i in _imports(hub) for word in ROUTING_AND_SIGNATURES)


def test_layers_is_installed_last_so_the_hubs_show_it_where_they_did() -> None:
    """The layers diagnostic is a built-in one, after the others moved before it: its
    run-table columns, lines, junit properties and figures come after theirs, as before it
    moved; then routing (its columns and lines came after every other diagnostic's) and
    signatures (no column, no line; its check came last)."""
    from pytest_logprob_drift.diagnostics.registry import BUILTIN, by_name

    assert BUILTIN[-3:] == (
        "pytest_logprob_drift.diagnostics.layers",
        "pytest_logprob_drift.diagnostics.routing",
        "pytest_logprob_drift.diagnostics.signatures",
    )
    layers = by_name("layers")
    assert layers is not None
    assert layers.sealed_files == ("layers_training.pt", "layers_rollout.pt")
    assert not layers.always_in_table
    assert not layers.shown([None])


def test_registry_refuses_a_second_diagnostic_of_one_name() -> None:
    builtin = registry.by_name("importance_sampling")
    assert builtin is not None
    with pytest.raises(ValueError, match="diagnostic importance_sampling is installed already"):
        registry.install(builtin)
    assert [d.name for d in registry.installed()].count("importance_sampling") == 1


def test_the_diagnostics_type_is_assembled_from_the_installed_diagnostics() -> None:
    """Today's members stay declared (the built-ins' parts among them); an installed
    diagnostic's part is a member after them, typed by its part type; the type is built once
    per installed set."""
    declared = Diagnostics.__struct_fields__
    assert registry.diagnostics_type() is Diagnostics
    assert all(d.name in declared for d in registry.installed())
    registry.install(DIAGNOSTIC)
    try:
        built = registry.diagnostics_type()
        assert built is registry.diagnostics_type()
        assert issubclass(built, Diagnostics)
        assert built.__struct_fields__ == (*declared, NAME)
        part = {"log_ratio": 0.5, "sample": 1, "position": 2, "token_id": 3}
        masked = {
            "samples": 1,
            "tokens": 2,
            "mismatches": 0,
            "max_abs_diff": 0.0,
            "nonfinite_tokens": 0,
        }
        record = from_builtins({NAME: part, "masked_by_run": masked}, built)
        assert getattr(record, NAME) == LogRatioPeak(**part)
        assert list(record.to_json()) == ["masked_by_run", NAME]  # sealed after the declared
        with pytest.raises(ValueError, match=rf"\$\.{NAME}\.sample: Expected `int`"):
            from_builtins({NAME: {**part, "sample": "1"}}, built)
    finally:
        registry.uninstall(NAME)
    assert registry.diagnostics_type() is Diagnostics


@pytest.mark.process  # sys.modules of a fresh interpreter
def test_the_registry_imports_no_diagnostic_torch_or_typing_until_asked() -> None:
    code = (
        "import sys\n"
        "from pytest_logprob_drift.diagnostics import registry\n"
        "heavy = ('torch', 'typing', 'pytest_logprob_drift.diagnostics.importance_sampling',\n"
        "         'pytest_logprob_drift.diagnostics.path_split',\n"
        "         'pytest_logprob_drift.diagnostics.full_vocabulary',\n"
        "         'pytest_logprob_drift.diagnostics.layers',\n"
        "         'pytest_logprob_drift.diagnostics.routing',\n"
        "         'pytest_logprob_drift.diagnostics.signatures')\n"
        "print([m for m in heavy if m in sys.modules])\n"
        "print([d.name for d in registry.installed()])\n"
        "print('torch' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    expected = [
        "[]",
        "['importance_sampling', 'full_vocabulary', 'path_split', 'layers', 'routing', "
        "'signatures']",
        "False",
    ]
    assert proc.stdout.splitlines() == expected, proc.stdout
