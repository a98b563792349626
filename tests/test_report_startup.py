"""What keeps ``report`` cheap to start: the token decoder resolves an already built tiny
checkpoint without importing transformers (issue 53; ``runtimes/tiny_model.py`` imports torch
and transformers only to build one)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
WAVE4_HF = ROOT / "data" / "wave4" / "runs" / "wave4-hf-bf16"  # identity: tiny://qwen3-h64-v1


@pytest.mark.process  # sys.modules of a fresh interpreter at exit
def test_report_decodes_token_text_without_importing_transformers(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint

    # Built (or found) here, as any earlier run would have: the report only resolves it.
    directory = resolve_checkpoint("tiny://qwen3-h64-v1", expected_digest=None).path
    run_dir = tmp_path / WAVE4_HF.name
    shutil.copytree(WAVE4_HF, run_dir)
    page = tmp_path / "page.html"
    code = (
        "import sys\n"
        "from pytest_logprob_drift.cli import main\n"
        f"code = main(['report', {str(run_dir)!r}, '--html', {str(page)!r}, '--json'])\n"
        "print(code, sorted(m for m in ('transformers', 'tokenizers') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    *report, last = result.stdout.splitlines()
    # The decoder ran (tokenizers loaded), transformers never did.
    assert last == "0 ['tokenizers']", result.stderr[-3000:]
    assert json.loads("\n".join(report))
    # The page's token tables carry each id's text as the checkpoint's own tokenizer decodes it.
    text = page.read_text()
    start = text.index('"texts":') + len('"texts":')
    texts, _ = json.JSONDecoder().raw_decode(text, start)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    plain = {
        token: shown
        for token, shown in texts.items()
        if tokenizer.decode([int(token)], skip_special_tokens=False).isprintable()
    }
    assert len(plain) >= 5, texts
    for token, shown in plain.items():
        assert shown == tokenizer.decode([int(token)], skip_special_tokens=False), token
