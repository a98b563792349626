"""Layer diagnostics on the ``hf`` runtime (issue 23): a real bf16 experiment on the deep tiny
Qwen3 (8 decoder layers) run twice through the CLI, with ``diagnostics.layers`` on and off.

Everything claimed about the sealed layers is checked against computations written here: the
digests against SHA-256 of states captured by hooks written here on plain transformers
models, the relative errors against exact float64 ones, the structural truths against the
baseline's sealed digests directly, and ``verify`` against tampered and resealed files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from drift_testing import DEEP_SMALL, cli, experiment_config
from layer_hooks import digests16, hooked_states, plain_model, scoring_rows

from pytest_logprob_drift.numerics.layer_reduction import RELATIVE_ERROR_BAND
from pytest_logprob_drift.store.files import json_bytes
from pytest_logprob_drift.store.layout import COMPLETE
from pytest_logprob_drift.tensorio import tensor_bytes

pytestmark = pytest.mark.slow

TRAINING, ROLLOUT = "layers_training.pt", "layers_rollout.pt"
STATES = [*(str(k) for k in range(9)), "final_norm", "logits"]
LABELS = {
    "baseline",
    "training.lm_head_dtype=float32",
    "training.attention_backend=eager",
    "rollout.dtype=float32",
    "rollout.lm_head_dtype=float32",
}


def _config(directory: Path, layers: bool) -> Path:
    changes: dict[str, Any] = {
        **DEEP_SMALL,
        "experiment_id": "hf-layers-" + ("on" if layers else "off"),
        "baseline.training.lm_head_dtype": "compute",
        "baseline.rollout.lm_head_dtype": "compute",
        "interventions": [
            {"path": "training.lm_head_dtype", "values": ["float32"]},
            {"path": "training.attention_backend", "values": ["eager"]},
            {"path": "rollout.dtype", "values": ["float32"]},
            {"path": "rollout.lm_head_dtype", "values": ["float32"]},
        ],
    }
    if layers:
        changes["diagnostics"] = {"layers": True}
    return experiment_config(directory, "cross_config_s0_hf_tiny_bf16.json", changes)


def _load(path: Path) -> dict[str, torch.Tensor]:
    loaded: dict[str, torch.Tensor] = torch.load(path, weights_only=True)
    return loaded


def _run(directory: Path, layers: bool) -> dict[str, Any]:
    config = _config(directory, layers)
    artifacts = directory / "runs"
    code, out, err = cli("run", config, "--runtime", "hf", "--artifacts", artifacts)
    assert code == 1, err[-3000:]  # the knobs' cases MISMATCH
    run_dir = artifacts / json.loads(config.read_text())["experiment_id"]
    cases = {}
    for path in (run_dir / "cases").glob("*/*/comparison.json"):
        comparison = json.loads(path.read_text())
        cases[comparison["label"]] = {"comparison": comparison, "attempt": path.parent}
    (attribution,) = run_dir.glob("attributions/*/attribution.json")
    return {
        "text": out,
        "cases": cases,
        "run_dir": run_dir,
        "attribution": {c["label"]: c for c in json.loads(attribution.read_text())["cases"]},
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    directory = tmp_path_factory.mktemp("layers-hf")
    return {"on": _run(directory, True), "off": _run(directory, False)}


@pytest.fixture(scope="module")
def on(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return runs["on"]


def test_every_case_captures_both_sides(on: dict[str, Any]) -> None:
    assert set(on["cases"]) == LABELS
    for label, case in on["cases"].items():
        layers = case["comparison"]["diagnostics"]["layers"]
        for side in ("training", "rollout"):
            assert layers[side]["status"] == "layers_captured", (label, side)
            assert layers[side]["evidence"]["decoder_layers"] == 8
        assert [s["state"] for s in layers["figures"]["states"]] == STATES
        assert (case["attempt"] / TRAINING).is_file() and (case["attempt"] / ROLLOUT).is_file()


def test_the_probe_changes_no_verdict_mismatch_count_case_id_or_score(
    runs: dict[str, dict[str, Any]],
) -> None:
    on, off = runs["on"], runs["off"]
    assert set(on["cases"]) == set(off["cases"]) == LABELS
    for label in LABELS:
        a, b = on["cases"][label], off["cases"][label]
        for key in ("case_id", "outcome", "mismatches", "active_tokens", "numerical"):
            assert a["comparison"][key] == b["comparison"][key], (label, key)
        assert "layers" not in b["comparison"]["diagnostics"]
        for name in ("score_rollout.pt", "score_training.pt", "token_diffs.pt"):
            assert (a["attempt"] / name).read_bytes() == (b["attempt"] / name).read_bytes()
        assert not (b["attempt"] / TRAINING).exists() and not (b["attempt"] / ROLLOUT).exists()
        assert "layers" not in off["attribution"].get(label, {})


# ---------------------------------------------------------------- an independent recompute


def test_sealed_reductions_agree_with_plain_transformers_hooks(on: dict[str, Any]) -> None:
    """rollout.dtype=float32: the rollout side is the fp32 model, the training side the bf16
    one; both sides' digests and norms, and the per-state relative errors, recomputed here."""
    torch.set_num_threads(1)
    case = on["cases"]["rollout.dtype=float32"]
    batch = _load(case["attempt"] / "score_rollout.pt")
    sides = {
        TRAINING: scoring_rows(
            hooked_states(plain_model(torch.bfloat16), batch), batch["active_mask"]
        ),
        ROLLOUT: scoring_rows(
            hooked_states(plain_model(torch.float32), batch), batch["active_mask"]
        ),
    }
    for name, states in sides.items():
        sealed = _load(case["attempt"] / name)
        for s, state in enumerate(states):
            assert [bytes(d.tolist()) for d in sealed["digests"][s]] == digests16(state), (name, s)
            exact = torch.linalg.vector_norm(state.double(), dim=-1)
            assert torch.allclose(sealed["norms"][s], exact, rtol=1e-12, atol=0)
    figures = case["comparison"]["diagnostics"]["layers"]["figures"]
    assert figures["positions"] == int(batch["active_mask"].sum())
    low, high = RELATIVE_ERROR_BAND
    for s, row in enumerate(figures["states"]):
        a, b = sides[TRAINING][s].double(), sides[ROLLOUT][s].double()
        exact = torch.linalg.vector_norm(a - b, dim=-1) / torch.linalg.vector_norm(a, dim=-1)
        assert row["bitwise_equal_share"] == 0.0  # bf16 against fp32 states: other bytes
        assert low * float(exact.max()) <= row["max_rel_error"] <= high * float(exact.max())
        assert float(exact.min()) <= row["median_rel_error"] <= float(exact.max())
        assert 0.5 * float(exact.median()) <= row["median_rel_error"] <= 2 * float(exact.median())


def test_both_bf16_sides_agree_bitwise_at_every_layer(on: dict[str, Any]) -> None:
    """The baseline runs the same bf16 sdpa forward on both sides: the hooks written here see
    the same bytes whichever model object runs it, and the sealed figures say so."""
    case = on["cases"]["baseline"]
    batch = _load(case["attempt"] / "score_rollout.pt")
    mine = scoring_rows(hooked_states(plain_model(torch.bfloat16), batch), batch["active_mask"])
    for name in (TRAINING, ROLLOUT):
        sealed = _load(case["attempt"] / name)
        assert [[bytes(d.tolist()) for d in state] for state in sealed["digests"]] == [
            digests16(s) for s in mine
        ]
    figures = case["comparison"]["diagnostics"]["layers"]["figures"]
    assert figures["first_unequal_state"] is None


# ---------------------------------------------------------------- structural truths


def _equal_by_state(case: Path, baseline: Path, name: str) -> list[bool]:
    a, b = _load(case / name), _load(baseline / name)
    assert torch.equal(a["positions"], b["positions"])
    return [bool(v) for v in (a["digests"] == b["digests"]).all(-1).all(-1)]


def _first_false(flags: list[bool]) -> str | None:
    return next((STATES[i] for i, ok in enumerate(flags) if not ok), None)


def test_float32_lm_head_on_the_trainer_moves_only_the_logits(on: dict[str, Any]) -> None:
    case, base = on["cases"]["training.lm_head_dtype=float32"], on["cases"]["baseline"]
    flags = _equal_by_state(case["attempt"], base["attempt"], TRAINING)
    assert flags == [True] * 10 + [False]  # every decoder layer and the final norm equal
    assert _equal_by_state(case["attempt"], base["attempt"], ROLLOUT) == [True] * 11
    layers = on["attribution"]["training.lm_head_dtype=float32"]["layers"]
    assert layers["training"]["first_moved_layer"] == "logits"
    assert layers["rollout"]["first_moved_layer"] is None
    assert layers["training"]["max_rel_error"] > 0.0


def test_the_findings_say_where_in_the_network_each_mover_moved(on: dict[str, Any]) -> None:
    """``report``'s findings carry the sealed attribution by layer: the float32 LM head's
    training side reads "moved at the logits", derived above from the sealed digests."""
    code, out, err = cli("report", on["run_dir"], "--json")
    assert code == 0, err
    moved = {f["label"]: f for f in json.loads(out)["findings"]["moved"]}
    head = "training.lm_head_dtype=float32"
    assert head in moved, sorted(moved)
    fact = moved[head]["facts"]["layers:"]
    assert fact.startswith(
        "training side decoder layers and final norm bitwise equal to the baseline;"
        " moved at the logits"
    ), fact
    assert "rollout side" not in fact  # its rollout is bitwise equal at every layer
    for label, finding in moved.items():
        sides = on["attribution"][label]["layers"]
        named = [s for s in ("training", "rollout") if sides.get(s, {}).get("first_moved_layer")]
        assert [
            s for s in ("training", "rollout") if f"{s} side" in finding["facts"].get("layers:", "")
        ] == named


def test_eager_attention_leaves_the_embeddings_bitwise_equal(on: dict[str, Any]) -> None:
    case, base = on["cases"]["training.attention_backend=eager"], on["cases"]["baseline"]
    flags = _equal_by_state(case["attempt"], base["attempt"], TRAINING)
    assert flags[0]  # the embeddings come before any attention
    derived = _first_false(flags)
    assert derived != "0"
    layers = on["attribution"]["training.attention_backend=eager"]["layers"]
    assert layers["training"]["first_moved_layer"] == derived
    if derived is not None:  # a moved residual stream stays moved downstream
        assert not any(flags[STATES.index(derived) :])


@pytest.mark.parametrize("label", ["rollout.dtype=float32", "rollout.lm_head_dtype=float32"])
def test_a_rollout_only_knob_leaves_every_training_layer_bitwise_equal(
    on: dict[str, Any], label: str
) -> None:
    case, base = on["cases"][label], on["cases"]["baseline"]
    mine, ref = (
        _load(case["attempt"] / "score_rollout.pt"),
        _load(base["attempt"] / "score_rollout.pt"),
    )
    if not torch.equal(mine["token_ids"], ref["token_ids"]):
        pytest.fail(f"{label} sampled other tokens: the comparison would need a shared subset")
    assert _equal_by_state(case["attempt"], base["attempt"], TRAINING) == [True] * 11
    layers = on["attribution"][label]["layers"]
    assert layers["training"]["first_moved_layer"] is None
    assert layers["rollout"]["first_moved_layer"] == _first_false(
        _equal_by_state(case["attempt"], base["attempt"], ROLLOUT)
    )


def test_the_run_prints_where_each_side_moved(on: dict[str, Any]) -> None:
    text = on["text"]
    assert "where in the network each side moved (against the baseline):" in text
    line = next(
        ln
        for ln in text.splitlines()
        if ln.startswith("training.lm_head_dtype=float32 ")
        and "by layer" not in ln
        and "bitwise equal" in ln
    )
    assert (
        "decoder layers and final norm bitwise equal to the baseline; moved at the logits" in line
    )


# ---------------------------------------------------------------- verify


def test_verify_accepts_the_layers_and_recomputes_them(on: dict[str, Any]) -> None:
    code, out, err = cli("verify", on["run_dir"], "--json")
    assert code == 0, out[-3000:] + err[-2000:]


def _copy_run(on: dict[str, Any], tmp_path: Path, label: str) -> tuple[Path, Path]:
    run_dir = tmp_path / on["run_dir"].name
    shutil.copytree(on["run_dir"], run_dir)
    attempt = run_dir / on["cases"][label]["attempt"].relative_to(on["run_dir"])
    for path in attempt.iterdir():
        os.chmod(path, 0o644)
    return run_dir, attempt


def _reseal(attempt: Path) -> None:
    document: dict[str, Any] = json.loads((attempt / COMPLETE).read_text())
    document["files"] = {
        name: hashlib.sha256((attempt / name).read_bytes()).hexdigest()
        for name in document["files"]
    }
    (attempt / COMPLETE).write_bytes(json_bytes(document))


def _invalid(run_dir: Path) -> list[dict[str, Any]]:
    code, out, _ = cli("verify", run_dir, "--json")
    assert code == 1, out[-2000:]
    return [a for a in json.loads(out)["attempts"] if a["status"] == "invalid"]


def test_verify_catches_a_tampered_layer_file(on: dict[str, Any], tmp_path: Path) -> None:
    run_dir, attempt = _copy_run(on, tmp_path, "baseline")
    data = bytearray((attempt / ROLLOUT).read_bytes())
    data[len(data) // 2] ^= 0x01
    (attempt / ROLLOUT).write_bytes(bytes(data))
    (bad,) = _invalid(run_dir)
    assert bad["file"] == ROLLOUT


@pytest.mark.parametrize(
    ("key", "detail"),
    [("projections", "recomputed offline differ"), ("digests", "recomputed offline differ")],
)
def test_verify_refuses_resealed_layers_the_figures_do_not_match(
    on: dict[str, Any], tmp_path: Path, key: str, detail: str
) -> None:
    run_dir, attempt = _copy_run(on, tmp_path, "rollout.dtype=float32")
    sealed = _load(attempt / ROLLOUT)
    if key == "projections":
        sealed[key][3, 0] *= 1.5  # after layer 3, one position
    else:
        sealed[key][3, 0] = _load(attempt / TRAINING)[key][3, 0]  # claim one state equal
    (attempt / ROLLOUT).write_bytes(tensor_bytes(sealed))
    _reseal(attempt)
    (bad,) = _invalid(run_dir)
    assert bad["file"] == ROLLOUT and detail in bad["detail"]


def test_verify_refuses_other_positions_and_a_missing_file(
    on: dict[str, Any], tmp_path: Path
) -> None:
    run_dir, attempt = _copy_run(on, tmp_path, "baseline")
    sealed = _load(attempt / TRAINING)
    sealed["positions"][0, 1] += 1
    (attempt / TRAINING).write_bytes(tensor_bytes(sealed))
    _reseal(attempt)
    (bad,) = _invalid(run_dir)
    assert bad["file"] == TRAINING and "positions" in bad["detail"]
    shutil.rmtree(run_dir)
    run_dir, attempt = _copy_run(on, tmp_path, "baseline")
    (attempt / ROLLOUT).unlink()
    document: dict[str, Any] = json.loads((attempt / COMPLETE).read_text())
    del document["files"][ROLLOUT]
    (attempt / COMPLETE).write_bytes(json_bytes(document))
    (bad,) = _invalid(run_dir)
    assert bad["file"] == ROLLOUT and "not sealed" in bad["detail"]


def test_the_report_draws_the_layers_of_every_case(on: dict[str, Any], tmp_path: Path) -> None:
    from pytest_logprob_drift.diagnostics.layers.plot import load_layer_plot
    from pytest_logprob_drift.numerics.comparison import Diagnostics, from_builtins
    from pytest_logprob_drift.store.attempt import read_seal

    page = tmp_path / "report.html"
    code, _, err = cli("report", on["run_dir"], "--html", page)
    assert code == 0, err[-2000:]
    html = page.read_text()
    for name in ("layers-heatmap", "layers-by-state"):
        assert html.count(f"data-plot='{name}'") == len(on["cases"]), name
    case = on["cases"]["training.attention_backend=eager"]
    attempt = case["attempt"]
    plot = load_layer_plot(
        attempt,
        read_seal(attempt),
        from_builtins(case["comparison"]["diagnostics"], Diagnostics).layers,
    )
    assert plot is not None and plot.states == tuple(STATES)
    t, r = _load(attempt / TRAINING), _load(attempt / ROLLOUT)
    for s in range(len(STATES)):
        for n in range(t["norms"].shape[1]):
            same = bytes(t["digests"][s, n].tolist()) == bytes(r["digests"][s, n].tolist())
            diff = float((t["projections"][s, n] - r["projections"][s, n]).norm())
            want = 0.0 if same else diff / float(t["norms"][s, n])
            assert plot.errors[s, n] == pytest.approx(want, rel=1e-12, abs=0.0)
    assert (plot.errors[0] == 0).all()  # the embeddings: structurally bitwise equal
    shares = case["comparison"]["diagnostics"]["layers"]["figures"]["states"]
    for s, row in enumerate(shares):
        assert float((plot.errors[s] == 0).mean()) == row["bitwise_equal_share"]


def _sealed_rel_errors(attempt: Path) -> list[list[float]]:
    """Per state and position, the relative error recomputed here in float64 from the sealed
    reductions: 0 where the digests are equal, else |projection difference| / training norm."""
    t, r = _load(attempt / TRAINING), _load(attempt / ROLLOUT)
    out = []
    for s in range(t["norms"].shape[0]):
        row = []
        for n in range(t["norms"].shape[1]):
            same = bytes(t["digests"][s, n].tolist()) == bytes(r["digests"][s, n].tolist())
            pt, pr = t["projections"][s, n].tolist(), r["projections"][s, n].tolist()
            d = [a - b for a, b in zip(pt, pr, strict=True)]
            row.append(0.0 if same else sum(v * v for v in d) ** 0.5 / float(t["norms"][s, n]))
        out.append(row)
    return out


def test_the_report_draws_every_case_on_one_layer_plot(on: dict[str, Any], tmp_path: Path) -> None:
    """The run-level figure: one median and one max line per case, its data the sealed
    figures, which agree with the lower median and the max over positions recomputed here."""
    from pytest_logprob_drift.diagnostics.layers.run_plot import (
        HEAT_LOW,
        MAX_GID,
        MEDIAN_GID,
        all_layers_plot,
        drawn,
    )
    from pytest_logprob_drift.report.load import load_report

    page = tmp_path / "report.html"
    code, _, err = cli("report", on["run_dir"], "--html", page)
    assert code == 0, err[-2000:]
    html = page.read_text()
    assert html.count("data-plot='layers-all'") == 1
    section = html[html.index("<section id='layers'>") :]
    section = section[: section.index("</section>")]
    for gid in (MEDIAN_GID, MAX_GID):
        assert section.count(f'<g id="{gid.format("")}') == len(LABELS)
    assert "Not drawn" not in section  # every case has the 8 layers and both captures
    assert all(f">{label}</text>" in section for label in LABELS)
    plot = all_layers_plot(load_report(on["run_dir"], page_dir=tmp_path).cases)
    assert plot is not None and plot.states == tuple(STATES) and plot.left_out == ()
    assert {line.label for line in plot.lines} == LABELS
    for line in plot.lines:
        case = on["cases"][line.label]
        rows = case["comparison"]["diagnostics"]["layers"]["figures"]["states"]
        assert line.median == tuple(row["median_rel_error"] for row in rows)
        assert line.max == tuple(row["max_rel_error"] for row in rows)
        errors = _sealed_rel_errors(case["attempt"])
        medians = [sorted(values)[(len(values) - 1) // 2] for values in errors]
        maxima = [max(values) for values in errors]
        assert line.median == pytest.approx(medians, rel=1e-12, abs=0.0), line.label
        assert line.max == pytest.approx(maxima, rel=1e-12, abs=0.0), line.label
        assert list(drawn(line.median)) == pytest.approx([max(v, HEAT_LOW) for v in medians])
    code, out, err = cli("report", on["run_dir"], "--json")
    assert code == 0, err
    for entry in json.loads(out)["cases"]:  # the JSON carries the sealed figures as they are
        sealed = on["cases"][entry["label"]]["comparison"]["diagnostics"]["layers"]
        assert entry["diagnostics"]["layers"] == sealed


def _words(state: str | None) -> str:
    if state is None:
        return "-"
    return {"0": "embeddings", "final_norm": "final norm", "logits": "logits"}.get(
        state, f"layer {state}"
    )


def test_the_run_table_says_where_the_sides_first_differ(on: dict[str, Any]) -> None:
    lines = on["text"].splitlines()
    header = next(ln for ln in lines if ln.startswith("case_id "))
    start, logits = header.index("layers differ at"), header.index("max rel (logits)")
    assert header[logits:].rstrip() == "max rel (logits)"  # the last column
    for label, case in on["cases"].items():
        comparison = case["comparison"]
        row = next(ln for ln in lines if ln.startswith(comparison["case_id"] + " "))
        figures = comparison["diagnostics"]["layers"]["figures"]
        last = figures["states"][-1]
        assert last["state"] == "logits"
        assert row[start:logits].strip() == _words(figures["first_unequal_state"]), label
        assert row[logits:].strip() == f"{last['max_rel_error']:.3g}", label
    baseline = on["cases"]["baseline"]["comparison"]
    row = next(ln for ln in lines if ln.startswith(baseline["case_id"] + " "))
    assert row[start:logits].strip() == "-"  # bf16 sdpa on both sides: bitwise equal


_LAYER_PLOT_PROBE = """
(() => {
  const svg = document.querySelector("figure[data-plot='layers-all'] svg");
  const box = svg.getBoundingClientRect();
  const inside = (b) => b.left >= box.left - 0.5 && b.right <= box.right + 0.5
      && b.top >= box.top - 0.5 && b.bottom <= box.bottom + 0.5;
  const lines = [...svg.querySelectorAll("g[id^='lpd-layer-']")];
  return {
    right: box.right, viewport: document.documentElement.clientWidth,
    texts: [...svg.querySelectorAll("text")].map(
        (t) => ({text: t.textContent, inside: inside(t.getBoundingClientRect())})),
    lines: lines.map((g) => ({id: g.id, drawn: g.querySelectorAll("path, use").length})),
  };
})()
"""


def test_the_layer_plot_reads_well_in_chromium(on: dict[str, Any], tmp_path: Path) -> None:
    """The all-cases figure in a real browser: drawn (not blank), one median and one max line
    per case, every text (the case labels in the legend included) inside the figure, the figure
    inside a 1400 px window. Skipped without Chromium (outside CI)."""
    from report_browser import open_page

    page = tmp_path / "report.html"
    code, _, err = cli("report", on["run_dir"], "--html", page)
    assert code == 0, err[-2000:]
    check = open_page(page, "report-layers-hf.png", probe=_LAYER_PLOT_PROBE)
    assert check.console_errors == [] and check.external_requests(page) == []
    (plot,) = [p for p in check.plots if p["plot"] == "layers-all"]
    assert plot["variance"] > 25.0 and plot["width"] > 300
    probe = check.probe
    assert sorted(line["id"] for line in probe["lines"]) == sorted(
        f"lpd-layer-{kind}-{i}" for kind in ("median", "max") for i in range(len(LABELS))
    )
    assert all(line["drawn"] > 0 for line in probe["lines"])
    assert [t for t in probe["texts"] if not t["inside"]] == []
    assert LABELS <= {t["text"] for t in probe["texts"]}
    assert probe["right"] <= probe["viewport"]
