"""``logprob-drift prompts``: user prompts frozen into token ids with the checkpoint's own
tokenizer, their ``source`` record, and what planning checks of it.

Every token id is compared with an independent ``transformers.AutoTokenizer`` computation
written here (``apply_chat_template(..., add_generation_prompt=True)`` for chat prompts), for
each tiny architecture's tokenizer; every digest with ``hashlib`` over the files' bytes. Every
bad input is one line on stderr naming the file and line, exit 2.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")

from drift_testing import cli  # noqa: E402

from pytest_logprob_drift.config.prompt_source import TOKENIZER_FILES  # noqa: E402
from pytest_logprob_drift.runtimes.tiny_model import (  # noqa: E402
    TINY_ARCHITECTURES,
    build_tiny_architecture,
    build_tiny_checkpoint,
)

ARCHS = [arch.name for arch in TINY_ARCHITECTURES]

CHATS: dict[str, list[list[dict[str, str]]]] = {
    "default": [
        [{"role": "user", "content": "Which change makes the rollout drift?"}],
        [
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "Tensor parallel size 2, or prefix caching?"},
        ],
        [
            {"role": "user", "content": "Numbers: 0 1 2 3 4 5 6 7 8 9 10 16 32 64."},
            {"role": "assistant", "content": "Seen."},
            {"role": "user", "content": "Unicode too: café, naïve, 日本."},
        ],
    ],
    # The tiny Mistral template (like Mistral's) accepts only user and assistant turns.
    "mistral-h64-v1": [
        [{"role": "user", "content": "Which change makes the rollout drift?"}],
        [
            {"role": "user", "content": "Numbers: 0 1 2 3 4 5 6 7 8 9 10 16 32 64."},
            {"role": "assistant", "content": "Seen."},
            {"role": "user", "content": "Unicode too: café, naïve, 日本."},
        ],
    ],
}
TEXTS = ["The rollout engine samples a response.", "  leading spaces, and a tab\there", "日本語"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny Qwen3 (no chat template) and each tiny architecture, built from code."""
    root = tmp_path_factory.mktemp("checkpoints")
    built = {"qwen3": root / "qwen3"}
    build_tiny_checkpoint(built["qwen3"])
    for arch in TINY_ARCHITECTURES:
        built[arch.name] = root / arch.name
        build_tiny_architecture(arch, built[arch.name])
    return built


def _jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return path


def _prompts(*args: str | Path) -> tuple[int, str, str]:
    return cli("prompts", *args)


def _one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("logprob-drift: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)


def _independent_chat_ids(model_dir: Path, messages: list[dict[str, str]]) -> list[int]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    return [int(t) for t in ids]


@pytest.mark.parametrize("arch", ARCHS)
def test_chat_messages_equal_independent_apply_chat_template(
    checkpoints: dict[str, Path], tmp_path: Path, arch: str
) -> None:
    model_dir = checkpoints[arch]
    chats = CHATS.get(arch, CHATS["default"])
    source = _jsonl(
        tmp_path / "chats.jsonl", [{"id": i, "messages": m} for i, m in enumerate(chats)]
    )
    output = tmp_path / "prompts.json"
    code, out, err = _prompts(
        "--checkpoint", model_dir, source, "--messages-field", "messages", "--output", output
    )
    assert code == 0, err
    written = json.loads(output.read_text())
    expected = [_independent_chat_ids(model_dir, m) for m in chats]
    assert written["token_ids"] == expected
    assert all(len(row) > 0 for row in expected)
    record = written["source"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    assert (
        record["chat_template_sha256"]
        == hashlib.sha256(tokenizer.chat_template.encode()).hexdigest()
    )
    assert record["add_generation_prompt"] is True
    assert record["input"] == {
        "file": "chats.jsonl",
        "format": "jsonl",
        "sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
    }
    assert record["messages_field"] == "messages" and record["field"] is None
    assert record["lines"] == list(range(1, len(chats) + 1))
    present = [n for n in TOKENIZER_FILES if (model_dir / n).is_file()]
    assert "tokenizer.json" in present
    assert record["tokenizer_files"] == {
        n: hashlib.sha256((model_dir / n).read_bytes()).hexdigest() for n in present
    }
    assert f"wrote {len(chats)} prompt(s)" in out


@pytest.mark.parametrize("arch", ARCHS)
def test_text_with_chat_template_is_one_user_message(
    checkpoints: dict[str, Path], tmp_path: Path, arch: str
) -> None:
    model_dir = checkpoints[arch]
    source = tmp_path / "prompts.txt"
    source.write_text("\n".join(TEXTS) + "\n")
    output = tmp_path / "prompts.json"
    code, _, err = _prompts(
        "--checkpoint", model_dir, source, "--chat-template", "--output", output
    )
    assert code == 0, err
    expected = [_independent_chat_ids(model_dir, [{"role": "user", "content": t}]) for t in TEXTS]
    assert json.loads(output.read_text())["token_ids"] == expected


@pytest.mark.parametrize("special", [False, True])
def test_plain_text_field_equals_independent_encoding(
    checkpoints: dict[str, Path], tmp_path: Path, special: bool
) -> None:
    model_dir = checkpoints["qwen3"]
    source = _jsonl(tmp_path / "p.jsonl", [{"prompt": t, "other": 1} for t in TEXTS])
    output = tmp_path / "prompts.json"
    flags = ["--add-special-tokens"] if special else []
    code, _, err = _prompts(
        "--checkpoint", model_dir, source, "--field", "prompt", *flags, "--output", output
    )
    assert code == 0, err
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    expected = [tokenizer(t, add_special_tokens=special)["input_ids"] for t in TEXTS]
    written = json.loads(output.read_text())
    assert written["token_ids"] == expected
    assert written["source"]["add_special_tokens"] is special
    assert written["source"]["chat_template_sha256"] is None
    assert written["source"]["field"] == "prompt"


def test_limit_and_truncate(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    model_dir = checkpoints["llama-h64-v1"]
    source = tmp_path / "p.txt"
    source.write_text("\n".join(TEXTS) + "\n")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    full = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    cap = min(len(row) for row in full[:2]) - 1
    assert cap >= 1
    output = tmp_path / "cut.json"
    code, out, err = _prompts(
        "--checkpoint", model_dir, source, "--limit", "2", "--max-prompt-tokens", str(cap),
        "--truncate", "--output", output,
    )  # fmt: skip
    assert code == 0, err
    written = json.loads(output.read_text())
    assert written["token_ids"] == [row[:cap] for row in full[:2]]
    assert written["source"]["truncated"] == [1, 2]
    assert written["source"]["lines"] == [1, 2]
    assert (written["source"]["limit"], written["source"]["max_prompt_tokens"]) == (2, cap)
    assert "2 truncated" in out


def test_an_existing_output_is_never_overwritten(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    source = tmp_path / "p.txt"
    source.write_text("\n".join(TEXTS) + "\n")
    output = tmp_path / "prompts.json"
    output.write_text("keep me\n")
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "nowhere")
    for target in (output, dangling):
        code, _, err = _prompts("--checkpoint", checkpoints["qwen3"], source, "--output", target)
        _one_line_error(code, err, str(target), "already exists")
    assert output.read_text() == "keep me\n"
    assert not (tmp_path / "nowhere").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.json", "p.txt", "prompts.json"]


def _bad_inputs(
    tmp: Path, qwen3: Path, llama: Path, mistral: Path
) -> list[tuple[list[Any], list[str]]]:
    """(arguments, what the one line must say) for each bad input."""
    cases: list[tuple[list[Any], list[str]]] = []

    def jsonl(name: str, text: str) -> Path:
        path = tmp / name
        path.write_text(text)
        return path

    p = jsonl("missing.jsonl", '{"text": "a"}\n{"prompt": "b"}\n')
    cases.append(([qwen3, p], [f"{p}:2:", "no field 'text'"]))
    p = jsonl("empty.jsonl", '{"text": "a"}\n{"text": "b"}\n{"text": "   "}\n')
    cases.append(([qwen3, p], [f"{p}:3:", "empty prompt"]))
    p = jsonl("number.jsonl", '{"text": 5}\n')
    cases.append(([qwen3, p], [f"{p}:1:", "'text' is a number, expected a string"]))
    p = jsonl("notjson.jsonl", '{"text": "a"}\n{"text": \n')
    cases.append(([qwen3, p], [f"{p}:2:", "not JSON"]))
    p = jsonl("array.jsonl", '["a"]\n')
    cases.append(([qwen3, p], [f"{p}:1:", "expected a JSON object"]))
    p = jsonl("m1.jsonl", '{"m": [{"role": "user", "content": "a"}]}\n{"m": "hello"}\n')
    cases.append(
        ([llama, p, "--messages-field", "m"], [f"{p}:2:", "'m' is a string, expected an array"])
    )
    p = jsonl("m2.jsonl", '{"m": [{"role": "user"}]}\n')
    cases.append(([llama, p, "--messages-field", "m"], [f"{p}:1:", "'m'[0].content is missing"]))
    p = jsonl("m3.jsonl", '{"m": [{"role": "user", "content": "a", "name": "x"}]}\n')
    cases.append(([llama, p, "--messages-field", "m"], [f"{p}:1:", "unknown key 'name'"]))
    p = jsonl("m4.jsonl", '{"m": []}\n')
    cases.append(([llama, p, "--messages-field", "m"], [f"{p}:1:", "an empty array"]))
    p = jsonl("m5.jsonl", '{"m": ["user: a"]}\n')
    cases.append(([llama, p, "--messages-field", "m"], [f"{p}:1:", "'m'[0] is a string"]))
    p = jsonl("m6.jsonl", '{"m": [{"role": "user", "content": 3}]}\n')
    cases.append(([llama, p, "--messages-field", "m"], [f"{p}:1:", "'m'[0].content is a number"]))
    p = jsonl(
        "sys.jsonl",
        '{"m": [{"role": "user", "content": "a"}]}\n{"m": [{"role": "system", "content": "a"}]}\n',
    )
    cases.append(
        (
            [mistral, p, "--messages-field", "m"],
            [f"{p}:2:", "chat template refused it", "only user and assistant"],
        )
    )
    p = jsonl("blank.txt", "first\n\nthird\n")
    cases.append(([qwen3, p], [f"{p}:2:", "empty prompt"]))
    p = tmp / "latin1.txt"
    p.write_bytes(b"fine\nalso fine\ncaf\xe9\n")
    cases.append(([qwen3, p], [f"{p}:3:", "not UTF-8"]))
    p = jsonl("ok.txt", "a prompt\n")
    cases.append(
        (
            [qwen3, p, "--chat-template"],
            [str(qwen3 / "tokenizer_config.json"), "no chat template", "--chat-template"],
        )
    )
    cases.append(
        ([qwen3, p, "--field", "text"], [str(p), "plain-text file has one prompt per line"])
    )
    p = jsonl("long.txt", "short\n" + "a much longer prompt with many words in it\n" * 2)
    cases.append(
        (
            [qwen3, p, "--max-prompt-tokens", "3"],
            [f"{p}:2:", "2 prompt(s) longer than --max-prompt-tokens 3: lines 2, 3", "--truncate"],
        )
    )
    cases.append(([qwen3, p, "--truncate"], ["--truncate needs --max-prompt-tokens"]))
    cases.append(
        (
            [llama, p, "--chat-template", "--add-special-tokens"],
            ["--add-special-tokens applies to plain text"],
        )
    )
    cases.append(([qwen3, tmp / "absent.jsonl"], [str(tmp / "absent.jsonl"), "no such file"]))
    cases.append(([qwen3, tmp], [str(tmp), "not a regular file"]))
    huge = tmp / "huge.jsonl"
    with huge.open("wb") as f:
        f.truncate(64 * 2**20 + 1)  # sparse: refused by its size before a byte is read
    cases.append(([qwen3, huge], [str(huge), "larger than the limit of 64 MiB"]))
    p = jsonl("nofile.txt", "x\n")
    cases.append(
        ([tmp / "no-checkpoint", p], [str(tmp / "no-checkpoint"), "not a checkpoint directory"])
    )
    return cases


def test_every_bad_input_is_one_line_naming_file_and_line(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    cases = _bad_inputs(
        tmp_path, checkpoints["qwen3"], checkpoints["llama-h64-v1"], checkpoints["mistral-h64-v1"]
    )
    for (checkpoint, source, *flags), needles in cases:
        output = tmp_path / "never.json"
        code, _, err = _prompts("--checkpoint", checkpoint, source, *flags, "--output", output)
        _one_line_error(code, err, *needles)
        assert not output.exists(), needles


def test_parquet_without_pyarrow_names_the_extra(
    checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as on an install without the extra
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    source = tmp_path / "p.parquet"
    source.write_bytes(b"PAR1 not really")
    code, _, err = _prompts(
        "--checkpoint", checkpoints["qwen3"], source, "--output", tmp_path / "o.json"
    )
    _one_line_error(code, err, str(source), "pyarrow", "'parquet' extra")


# --------------------------------------------------------------------------- planning


def _config(
    tmp_path: Path, checkpoint: Path | str, prompts: Path, *, special: bool = False
) -> Path:
    config = json.loads(
        (Path(__file__).parent.parent / "experiments" / "cross_config_s0_hf_tiny.json").read_text()
    )
    config["identity"]["checkpoint"]["uri"] = str(checkpoint)
    config["identity"]["tokenizer"]["add_special_tokens"] = special
    config["identity"]["prompts"] = {"file": str(prompts)}
    path = tmp_path / "experiment.json"
    path.write_text(json.dumps(config))
    return path


def test_planning_catches_a_changed_tokenizer(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    model_dir = tmp_path / "ckpt"
    shutil.copytree(checkpoints["llama-h64-v1"], model_dir)
    source = tmp_path / "p.txt"
    source.write_text("one prompt\nanother prompt\n")
    prompts = tmp_path / "prompts.json"
    assert (
        _prompts("--checkpoint", model_dir, source, "--chat-template", "--output", prompts)[0] == 0
    )
    config = _config(tmp_path, model_dir, prompts)
    code, _, err = cli("plan", config)
    assert code == 0, err
    tokenizer_json = model_dir / "tokenizer.json"
    tokenizer_json.write_bytes(tokenizer_json.read_bytes().replace(b'"<|eot_id|>"', b'"<|eot|>"'))
    code, _, err = cli("plan", config)
    _one_line_error(
        code,
        err,
        str(config),
        "$.identity.prompts.file<prompts.json>.source.tokenizer_files",
        "tokenizer file tokenizer.json of checkpoint",
        "has changed",
        "logprob-drift prompts",
    )
    (model_dir / "tokenizer.json").unlink()
    code, _, err = cli("plan", config)
    _one_line_error(code, err, "tokenizer.json", "is missing")


def test_planning_checks_add_special_tokens_and_the_record_shape(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    source = tmp_path / "p.txt"
    source.write_text("one prompt\n")
    prompts = tmp_path / "prompts.json"
    assert _prompts("--checkpoint", checkpoints["qwen3"], source, "--output", prompts)[0] == 0
    config = _config(tmp_path, checkpoints["qwen3"], prompts, special=True)
    code, _, err = cli("plan", config)
    _one_line_error(
        code,
        err,
        "$.identity.prompts.file<prompts.json>.source.add_special_tokens",
        "add_special_tokens=false",
        "says true",
    )
    document = json.loads(prompts.read_text())
    document["source"]["tokenizer_files"]["tokenizer.json"] = "not-a-digest"
    prompts.write_text(json.dumps(document))
    code, _, err = cli("plan", _config(tmp_path, checkpoints["qwen3"], prompts))
    _one_line_error(
        code, err, "$.identity.prompts.file<prompts.json>.source.tokenizer_files.tokenizer.json"
    )
    document["source"]["tokenizer_files"]["tokenizer.json"] = "0" * 64
    document["source"]["lines"] = [1, 2]
    prompts.write_text(json.dumps(document))
    code, _, err = cli("plan", _config(tmp_path, checkpoints["qwen3"], prompts))
    _one_line_error(code, err, "source.lines", "2 line numbers for 1 prompts")


@pytest.mark.parametrize("form", ["array", "object"])
def test_prompt_files_without_source_still_plan(
    checkpoints: dict[str, Path], tmp_path: Path, form: str
) -> None:
    rows = [[300, 417, 529], [301, 700]]
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(rows if form == "array" else {"token_ids": rows}))
    code, out, err = cli("plan", _config(tmp_path, checkpoints["qwen3"], prompts), "--json")
    assert code == 0, err
    assert json.loads(out)["cases"]


def test_plan_of_a_prompts_file_with_source_stays_torch_free(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    source = tmp_path / "p.txt"
    source.write_text("one prompt\n")
    prompts = tmp_path / "prompts.json"
    assert (
        _prompts("--checkpoint", checkpoints["llama-h64-v1"], source, "--output", prompts)[0] == 0
    )
    config = _config(tmp_path, checkpoints["llama-h64-v1"], prompts)
    forbidden = ("torch", "transformers", "vllm", "tokenizers", "shutil", "typing")
    code = (
        "import sys\n"
        "from pytest_logprob_drift.cli import main\n"
        f"assert main(['plan', {str(config)!r}]) == 0\n"
        f"print([m for m in {forbidden!r} if m in sys.modules])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_parquet_text_and_messages(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    model_dir = checkpoints["qwen2-h64-v1"]
    chats = CHATS["default"]
    source = tmp_path / "p.parquet"
    pq.write_table(pa.table({"text": TEXTS, "messages": [*chats]}), source)
    output = tmp_path / "text.json"
    code, _, err = _prompts("--checkpoint", model_dir, source, "--output", output)
    assert code == 0, err
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    written = json.loads(output.read_text())
    assert written["token_ids"] == [
        tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS
    ]
    assert written["source"]["input"]["format"] == "parquet"
    assert written["source"]["input"]["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    code, _, err = _prompts(
        "--checkpoint", model_dir, source, "--messages-field", "messages", "--output", output
    )
    assert code == 0, err
    assert json.loads(output.read_text())["token_ids"] == [
        _independent_chat_ids(model_dir, m) for m in chats
    ]
    code, _, err = _prompts(
        "--checkpoint", model_dir, source, "--field", "missing", "--output", output
    )
    _one_line_error(code, err, f"{source}:1:", "no field 'missing'")
    bogus = tmp_path / "bogus.parquet"
    bogus.write_bytes(b"not parquet at all")
    code, _, err = _prompts("--checkpoint", model_dir, bogus, "--output", output)
    _one_line_error(code, err, str(bogus), "not a Parquet file")
