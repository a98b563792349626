"""``logprob-drift tiny NAME --output DIR`` (issue 60): a built-in tiny checkpoint written to a
directory of one's own, byte for byte the cached build, usable by ``prompts`` at once (the
tiny Llama's chat template included), never overwriting anything."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from drift_testing import cli

from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint


def _digests(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file() and not p.name.startswith(".")
    }


def test_tiny_writes_the_build_and_prompts_reads_its_chat_template(tmp_path: Path) -> None:
    target = tmp_path / "models" / "tiny-llama"
    code, out, err = cli("tiny", "llama-h64-v1", "--output", target)
    assert code == 0, err
    assert out == f"wrote tiny://llama-h64-v1 to {target} " + (
        f"(digest {resolve_checkpoint('tiny://llama-h64-v1', expected_digest=None).digest[:16]}"
        ", with a chat template)\n"
    )
    cached = resolve_checkpoint("tiny://llama-h64-v1", expected_digest=None).path
    assert _digests(target) == _digests(cached)
    assert "config.json" in _digests(target)
    assert not list(target.parent.glob(".*partial"))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "Say hello."}]}) + "\n")
    code, out, err = cli(
        "prompts", "--checkpoint", target, prompts, "--messages-field", "messages",
        "--output", tmp_path / "prompts.json",
    )  # fmt: skip
    assert code == 0, err
    assert out.startswith("wrote 1 prompt(s)")


def test_tiny_never_overwrites_and_knows_its_names(tmp_path: Path) -> None:
    existing = tmp_path / "taken"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    code, out, err = cli("tiny", "qwen3-h64-v1", "--output", existing)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        f"logprob-drift: error: {existing}: already exists; tiny never overwrites"
    ]
    assert (existing / "keep.txt").read_text() == "mine"
    code, out, err = cli("tiny", "qwen9-h64-v1", "--output", tmp_path / "new")
    assert (code, out) == (2, "")
    assert "invalid choice: 'qwen9-h64-v1'" in err
    assert not (tmp_path / "new").exists()
