"""Import's memory is bounded by its caps, or the input is refused in one line (issue 47,
class 4).

A slime ``.pt`` whose zip declares far more than it holds is refused before ``torch.load``
inflates it (the same pre-check as the sealed ``.pt`` files, ``tensorio.inflation_problem``);
a line over the line cap is refused before it is decoded; and a step whose grid does not fit
the memory the process may use is one line, "out of memory" naming the step, exit 3, never
"internal error (a bug)". The peak resident memory at the caps is measured by
``benchmarks/bench_import_memory.py``, not here (no memory bound in a unit test).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from drift_testing import cli

from pytest_logprob_drift.production.sources import MAX_LINE_BYTES
from pytest_logprob_drift.tensorio import TensorFormatError, tensor_bytes, tensors_from_bytes


def _inflating(payload: bytes) -> bytes:
    """``payload`` (a torch.save archive) with one more member of 64 MiB of zeros, deflated
    to a few tens of KB: a zip that declares far more than it holds."""
    source = zipfile.ZipFile(io.BytesIO(payload))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for info in source.infolist():
            archive.writestr(info, source.read(info.filename))
        prefix = source.infolist()[0].filename.split("/")[0]
        archive.writestr(f"{prefix}/data/99", bytes(64 * 2**20), zipfile.ZIP_DEFLATED)
    return out.getvalue()


def test_a_slime_dump_whose_zip_inflates_is_refused_before_loading(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    torch.save({"format_version": 2, "rollout_id": 1, "samples": []}, buffer)
    dump = tmp_path / "train_data" / "1.pt"
    dump.parent.mkdir()
    data = _inflating(buffer.getvalue())
    assert len(data) < 2**20
    dump.write_bytes(data)
    code, out, err = cli("import", "--format", "slime", dump, "--artifacts", tmp_path / "out")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "zip members declare" in err and str(dump) in err
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


def test_a_sealed_pt_whose_zip_inflates_is_refused_by_the_same_check() -> None:
    data = _inflating(tensor_bytes({"x": torch.zeros(2)}))
    with pytest.raises(TensorFormatError, match="zip members declare"):
        tensors_from_bytes(data)
    assert tensors_from_bytes(tensor_bytes({"x": torch.zeros(2)}))["x"].shape == (2,)


def test_a_line_over_the_cap_is_refused_before_it_is_decoded(tmp_path: Path) -> None:
    source = tmp_path / "long.jsonl"
    with source.open("w") as out:
        out.write('{"step": 1, "pad": "')
        out.write("x" * MAX_LINE_BYTES)
        out.write('"}\n')
    code, _, err = cli("import", "--format", "jsonl", source, "--artifacts", tmp_path / "out")
    assert code == 2 and err.count("\n") == 1 and "line longer than 64 MiB" in err


CHILD = """
import resource, sys
from pytest_logprob_drift.cli import main
import pytest_logprob_drift.production.importer, torch  # what an import loads, before the limit
size = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
limit = size + 768 * 2**20
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.process
def test_a_grid_that_does_not_fit_is_out_of_memory_naming_the_step(tmp_path: Path) -> None:
    """Under an address-space limit 768 MiB above what the loaded importer takes, a step whose
    grid needs several GiB (2**25 cells: one row of 65,536 tokens among 512) fails to
    allocate: one line, exit 3, nothing published."""
    source = tmp_path / "grid.jsonl"
    width = 2**25 // 512
    with source.open("w") as out:
        for sample in range(512):
            length = width if sample == 0 else 2
            row = {
                "step": 7,
                "sample": sample,
                "token_ids": [1] * length,
                "prompt_length": 1,
                "mask": [1] * (length - 1),
                "rollout_logprobs": [-1.25] * (length - 1),
                "training_logprobs": [-1.25] * (length - 1),
            }
            out.write(json.dumps(row) + "\n")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, "import", "--format", "jsonl", str(source),
         "--artifacts", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "out of memory (step 7: its token grid does not fit" in done.stderr
    assert "a bug" not in done.stderr
    assert os.listdir(tmp_path / "out") == []
