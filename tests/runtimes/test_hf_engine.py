"""Tests of the tiny checkpoint, the transformers engine and the FSDP training scorer.

Tests that build a checkpoint, load a model or start FSDP ranks are marked ``slow``; the
parent<->rank protocol tests build nothing.
"""

from __future__ import annotations

import os
import socket
import subprocess
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
from torch import Tensor

from pytest_logprob_drift.references import UnresolvedReference
from pytest_logprob_drift.runtimes.tiny_model import (
    CheckpointError,
    ResolvedCheckpoint,
    build_tiny_checkpoint,
    checkpoint_digest,
    resolve_checkpoint,
)
from pytest_logprob_drift.runtimes.transformers import engine as hf_engine
from pytest_logprob_drift.runtimes.transformers import fsdp as fsdp_scoring
from pytest_logprob_drift.runtimes.transformers import fsdp_messages as wire
from pytest_logprob_drift.runtimes.transformers.fsdp_rank import resolve_logp_backend
from pytest_logprob_drift.tensorio import TensorFormatError

TINY = "tiny://qwen3-h64-v1"
PROMPTS = [[2, 75, 366, 111], [2, 300, 301], [2, 5, 6, 7, 8, 9, 10], [2, 400, 17, 93, 250]]
EOS, PAD = 1, 0
NEW_TOKENS = 16


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    # The tiny model gains nothing from intra-op threads; on a shared 2-core machine they only
    # contend. Restored afterwards so other test modules see the default.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> ResolvedCheckpoint:
    return resolve_checkpoint(
        TINY, expected_digest=None, cache_root=tmp_path_factory.mktemp("cache")
    )


@pytest.fixture(scope="module")
def fp32(tiny: ResolvedCheckpoint) -> object:
    return hf_engine.load_model(tiny.path, dtype="float32", attn_implementation="sdpa")


def rollout(
    model: object, *, batch_size: int = 4, temperature: float = 1.0, seed: int = 1, eos: int = EOS
) -> dict[str, Tensor]:
    return hf_engine.hf_rollout(
        model,
        PROMPTS,
        seed=seed,
        max_new_tokens=NEW_TOKENS,
        temperature=temperature,
        eos_token_id=eos,
        pad_token_id=PAD,
        batch_size=batch_size,
        logp_fn=hf_engine.native_selected_logprob,
    )


@pytest.fixture(scope="module")
def fp32_rollout(fp32: object) -> dict[str, Tensor]:
    return rollout(fp32)


def score(model: object, batch: dict[str, Tensor], batch_size: int = 4) -> Tensor:
    return hf_engine.hf_teacher_forced_score(
        model, batch, batch_size=batch_size, logp_fn=hf_engine.native_selected_logprob
    )


def max_active_diff(a: Tensor, b: Tensor, active: Tensor) -> float:
    return float((a - b).abs()[active].max())


# --------------------------------------------------------------------------- checkpoint


@pytest.mark.slow
def test_tiny_build_is_deterministic(tmp_path: Path, tiny: ResolvedCheckpoint) -> None:
    build_tiny_checkpoint(tmp_path / "a")
    build_tiny_checkpoint(tmp_path / "b")
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(
        names
    )
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert checkpoint_digest(tmp_path / "a") == checkpoint_digest(tmp_path / "b") == tiny.digest
    assert tiny.path.name == f"tiny-qwen3-h64-v1-{tiny.digest[:16]}"


@pytest.mark.slow
def test_tiny_tokenizer_and_config_agree(tiny: ResolvedCheckpoint) -> None:
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tiny.path, local_files_only=True)
    config = transformers.AutoConfig.from_pretrained(tiny.path, local_files_only=True)
    assert len(tok) == config.vocab_size == 1024
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) == (0, 1, 2)
    assert (config.pad_token_id, config.eos_token_id, config.bos_token_id) == (0, 1, 2)
    assert config.head_dim == 64 and not config.tie_word_embeddings
    text = "The rollout engine samples 123 tokens!"
    assert tok.decode(tok(text)["input_ids"]) == text


@pytest.mark.slow
def test_cache_reuse_tamper_and_digest_errors(tmp_path: Path, tiny: ResolvedCheckpoint) -> None:
    first = resolve_checkpoint(TINY, expected_digest=tiny.digest, cache_root=tmp_path)
    assert first.digest == tiny.digest and first.uri == TINY
    mtime = (first.path / "model.safetensors").stat().st_mtime_ns
    again = resolve_checkpoint(TINY, expected_digest=None, cache_root=tmp_path)
    assert again.path == first.path
    assert (again.path / "model.safetensors").stat().st_mtime_ns == mtime  # reused, not rebuilt

    with (first.path / "config.json").open("a") as f:
        f.write(" ")
    rebuilt = resolve_checkpoint(TINY, expected_digest=None, cache_root=tmp_path)
    assert rebuilt.digest == tiny.digest
    assert checkpoint_digest(rebuilt.path) == tiny.digest
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == [rebuilt.path.name]

    wrong = "0" * 64
    with pytest.raises(CheckpointError) as err:
        resolve_checkpoint(TINY, expected_digest=wrong, cache_root=tmp_path)
    assert wrong in str(err.value) and tiny.digest in str(err.value)
    with pytest.raises(CheckpointError) as err:
        resolve_checkpoint(str(tiny.path), expected_digest=wrong)
    assert wrong in str(err.value) and tiny.digest in str(err.value)
    local = resolve_checkpoint(str(tiny.path), expected_digest=tiny.digest)
    assert local.path == tiny.path and local.digest == tiny.digest

    with pytest.raises(CheckpointError, match="unknown tiny checkpoint"):
        resolve_checkpoint("tiny://nope", expected_digest=None, cache_root=tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_checkpoint(str(tmp_path / "missing"), expected_digest=None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        resolve_checkpoint(str(tmp_path / "empty"), expected_digest=None)
    assert issubclass(CheckpointError, ValueError)


# --------------------------------------------------------------------------- engine


@pytest.mark.slow
def test_load_model_errors_and_readback(tiny: ResolvedCheckpoint, fp32: object) -> None:
    with pytest.raises(ValueError, match="float64"):
        hf_engine.load_model(tiny.path, dtype="float64", attn_implementation="sdpa")
    with pytest.raises(ValueError, match="flash_attention_2"):
        hf_engine.load_model(tiny.path, dtype="float32", attn_implementation="flash_attention_2")
    with pytest.raises(ValueError, match="flex_attention"):
        hf_engine.load_model(tiny.path, dtype="float32", attn_implementation="flex_attention")
    back = hf_engine.read_back(fp32)
    assert back["param_dtype"] == "float32"
    assert back["attn_implementation"] == "sdpa"
    assert back["device"] == "cpu"
    assert back["num_parameters"] == 557952
    assert back["training"] is False


@pytest.fixture(scope="module")
def tied(tmp_path_factory: pytest.TempPathFactory) -> ResolvedCheckpoint:
    """The tiny Qwen2: its config ties the LM head to the input embedding, and its files hold
    no ``lm_head.weight`` (transformers ties it after loading)."""
    return resolve_checkpoint(
        "tiny://qwen2-h64-v1", expected_digest=None, cache_root=tmp_path_factory.mktemp("tied")
    )


def _is_tied(model: Any) -> bool:
    return model.lm_head.weight is model.model.embed_tokens.weight


def test_threads_loading_at_once_leave_every_tied_head_tied(tied: ResolvedCheckpoint) -> None:
    # transformers 5 swaps PreTrainedModel.tie_weights for a no-op while it builds a model; two
    # threads at once used to leave the no-op in place for good (found as meta-device LM heads
    # in a later test of the same worker).
    from transformers.modeling_utils import PreTrainedModel

    original = PreTrainedModel.tie_weights
    models: list[Any] = []
    errors: list[BaseException] = []

    def load() -> None:
        try:
            for _ in range(3):
                models.append(
                    hf_engine.load_model(tied.path, dtype="float32", attn_implementation="sdpa")
                )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(models) == 12
    assert PreTrainedModel.tie_weights is original
    after = hf_engine.load_model(tied.path, dtype="float32", attn_implementation="sdpa")
    assert all(_is_tied(model) for model in [*models, after])


def test_a_load_that_leaves_the_tied_head_empty_is_refused(tied: ResolvedCheckpoint) -> None:
    # The state the race left, made on purpose with transformers' own context manager.
    from transformers.initialization import no_tie_weights

    with (
        no_tie_weights(),
        pytest.raises(
            ValueError,
            match=r"qwen2.* did not load whole: parameter 'lm_head\.weight' holds no data "
            r"\(left on the meta device\)",
        ),
    ):
        hf_engine.load_model(tied.path, dtype="float32", attn_implementation="sdpa")
    assert _is_tied(hf_engine.load_model(tied.path, dtype="float32", attn_implementation="sdpa"))


@pytest.mark.slow
def test_rollout_canonical_form_and_peaked(fp32: object, fp32_rollout: dict[str, Tensor]) -> None:
    r = fp32_rollout
    assert set(r) == set(hf_engine.CANONICAL_KEYS)
    rows, _ = r["token_ids"].shape
    assert rows == len(PROMPTS)
    assert r["token_ids"].dtype == torch.int64 and r["logprobs"].dtype == torch.float32
    assert r["attention_mask"].dtype == torch.bool and r["active_mask"].dtype == torch.bool
    assert r["prompt_lengths"].tolist() == [len(p) for p in PROMPTS]
    for i, prompt in enumerate(PROMPTS):
        n = int(r["attention_mask"][i].sum())
        assert r["attention_mask"][i, :n].all() and not r["attention_mask"][i, n:].any()
        assert r["token_ids"][i, : len(prompt)].tolist() == prompt
        assert (r["token_ids"][i, n:] == PAD).all()
        assert r["position_ids"][i, :n].tolist() == list(range(n))
        assert (r["position_ids"][i, n:] == 0).all()
        active = r["active_mask"][i]
        assert active[len(prompt) : n].all() and int(active.sum()) == n - len(prompt)
        response = r["token_ids"][i, len(prompt) : n].tolist()
        assert 1 <= len(response) <= NEW_TOKENS
        assert EOS not in response[:-1]
        assert len(response) == NEW_TOKENS or response[-1] == EOS
        assert (r["logprobs"][i][~active] == 0).all() and (r["logprobs"][i][active] < 0).all()
    # Peaked next-token distributions: mean max-prob far above uniform (1/1024).
    with torch.no_grad():
        logits = fp32(  # type: ignore[operator]
            input_ids=r["token_ids"],
            attention_mask=r["attention_mask"].long(),
            position_ids=r["position_ids"],
        ).logits
    max_prob = logits.softmax(-1).max(-1).values[r["attention_mask"]].mean()
    assert float(max_prob) > 0.05


@pytest.mark.slow
def test_rollout_stops_at_first_eos(fp32: object) -> None:
    greedy = rollout(fp32, temperature=0.0)
    p = len(PROMPTS[0])
    response = greedy["token_ids"][0, p : p + NEW_TOKENS].tolist()
    stop = response[3]
    cut = response.index(stop)
    stopped = rollout(fp32, temperature=0.0, eos=stop)
    assert int(stopped["active_mask"][0].sum()) == cut + 1
    assert stopped["token_ids"][0, p : p + cut + 1].tolist() == response[: cut + 1]
    again = rollout(fp32, temperature=0.0)
    assert torch.equal(again["token_ids"], greedy["token_ids"])


@pytest.mark.slow
def test_fp32_rollout_matches_fp32_teacher_forced(
    fp32: object, fp32_rollout: dict[str, Tensor]
) -> None:
    r = fp32_rollout
    fp32.train()  # type: ignore[attr-defined]
    try:
        scored = score(fp32, r)
        assert fp32.training  # type: ignore[attr-defined]  # mode left as found
    finally:
        fp32.eval()  # type: ignore[attr-defined]
    assert all(p.grad is None for p in fp32.parameters())  # type: ignore[attr-defined]
    active = r["active_mask"]
    assert int(active.sum()) >= 3 * NEW_TOKENS
    assert (scored[~active] == 0).all()
    diff = max_active_diff(scored, r["logprobs"], active)
    assert diff < 1e-4, diff
    assert (
        torch.equal(score(fp32, r, batch_size=1), scored)
        or max_active_diff(score(fp32, r, batch_size=1), scored, active) < 1e-5
    )


@pytest.mark.slow
def test_batch_size_does_not_change_sampled_tokens(
    fp32: object, fp32_rollout: dict[str, Tensor]
) -> None:
    single = rollout(fp32, batch_size=1)
    assert torch.equal(single["token_ids"], fp32_rollout["token_ids"])
    assert (
        max_active_diff(single["logprobs"], fp32_rollout["logprobs"], single["active_mask"]) < 1e-4
    )
    other_seed = rollout(fp32, seed=2)
    assert not torch.equal(other_seed["token_ids"], fp32_rollout["token_ids"])


@pytest.mark.slow
def test_bf16_rollout_drifts_from_fp32_scoring(tiny: ResolvedCheckpoint, fp32: object) -> None:
    bf16 = hf_engine.load_model(tiny.path, dtype="bfloat16", attn_implementation="sdpa")
    assert hf_engine.read_back(bf16)["param_dtype"] == "bfloat16"
    r = rollout(bf16)
    assert torch.isfinite(r["logprobs"]).all()
    diff = max_active_diff(score(fp32, r), r["logprobs"], r["active_mask"])
    assert diff > 1e-3, diff


@pytest.mark.slow
def test_eager_and_sdpa_both_run(
    tiny: ResolvedCheckpoint, fp32: object, fp32_rollout: dict[str, Tensor]
) -> None:
    eager = hf_engine.load_model(tiny.path, dtype="float32", attn_implementation="eager")
    assert hf_engine.read_back(eager)["attn_implementation"] == "eager"
    r = rollout(eager)
    assert torch.equal(r["token_ids"], fp32_rollout["token_ids"])
    active = r["active_mask"]
    assert max_active_diff(score(eager, r), r["logprobs"], active) < 1e-4
    assert max_active_diff(score(fp32, r), score(eager, r), active) < 1e-4


@pytest.mark.slow
def test_scorer_rejects_non_canonical_batch(fp32: object, fp32_rollout: dict[str, Tensor]) -> None:
    bad = dict(fp32_rollout)
    bad["active_mask"] = bad["active_mask"].clone()
    bad["active_mask"][:, 0] = True
    with pytest.raises(ValueError, match="position 0"):
        score(fp32, bad)
    bad = dict(fp32_rollout)
    bad["attention_mask"] = bad["attention_mask"].flip(-1)
    with pytest.raises(ValueError, match="right-padded"):
        score(fp32, bad)


# --------------------------------------------------------------------------- FSDP


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError:
            return False
    return True


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0); our Popen objects reap, so this means alive.
    return False


@pytest.fixture
def crash_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "drift_crash_helper.py").write_text(
        textwrap.dedent(
            """
            import os
            import torch.distributed as dist
            from pytest_logprob_drift.runtimes.transformers.engine import native_selected_logprob

            def crash_on_rank1(logits, token_ids):
                if dist.get_rank() == 1:
                    os._exit(17)
                return native_selected_logprob(logits, token_ids)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "drift_crash_helper:crash_on_rank1"


@pytest.mark.slow
def test_fsdp_two_ranks_match_unsharded_then_crash_cleans_up(
    tiny: ResolvedCheckpoint,
    fp32: object,
    fp32_rollout: dict[str, Tensor],
    crash_backend: str,
) -> None:
    r = fp32_rollout
    unsharded = score(fp32, r)
    group = fsdp_scoring.FsdpScorerGroup(
        tiny.path, dtype="float32", attn_implementation="sdpa", world_size=2
    )
    try:
        pids = group.pids
        port = group.master_port
        assert len(pids) == 2 and os.getpid() not in pids
        sharded, evidence = group.score(r, batch_size=4, logp_backend=fsdp_scoring.NATIVE_LOGP)
        assert evidence["world_size"] == 2
        assert evidence["backend"] == "gloo"
        assert evidence["fsdp"] == "fully_shard"
        assert evidence["rank_pids"] == pids
        assert evidence["param_dtype"] == "float32"
        assert evidence["ranks_agree"] is True
        assert evidence["readonly_violations"] == []
        assert evidence["state_digests_before"] == evidence["state_digests_after"]
        assert evidence["forward_calls"] == [1, 1]
        local = evidence["local_param_numel"]
        assert isinstance(local, list) and sum(local) == evidence["num_parameters"]
        assert evidence["param_placements"] == ["(Shard(dim=0),)"]
        active = r["active_mask"]
        assert (sharded[~active] == 0).all()
        assert max_active_diff(sharded, unsharded, active) <= 1e-5
        assert max_active_diff(sharded, r["logprobs"], active) < 1e-4

        with pytest.raises(fsdp_scoring.FsdpScorerError, match=r"rank 1 exited \(code 17\)"):
            group.score(r, batch_size=4, logp_backend=crash_backend)
        assert group.closed
        with pytest.raises(fsdp_scoring.FsdpScorerError, match="closed"):
            group.score(r, batch_size=4, logp_backend=fsdp_scoring.NATIVE_LOGP)
    finally:
        group.close()
    assert all(_gone(pid) for pid in pids)
    assert _port_is_free(port)


@pytest.mark.slow
def test_fsdp_failed_start_leaves_no_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="float64"):
        fsdp_scoring.FsdpScorerGroup(tmp_path, dtype="float64", attn_implementation="sdpa")
    started: list[int] = []

    class RecordingPopen(subprocess.Popen[bytes]):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            started.append(self.pid)

    monkeypatch.setattr(subprocess, "Popen", RecordingPopen)
    (tmp_path / "config.json").write_text("{}")  # passes no check a rank needs: load fails
    with pytest.raises(fsdp_scoring.FsdpScorerError, match=r"rank [01] failed") as err:
        fsdp_scoring.FsdpScorerGroup(tmp_path, dtype="float32", attn_implementation="sdpa")
    assert "Traceback" in str(err.value)
    assert len(started) == 2
    assert all(_gone(pid) for pid in started)


# --------------------------------------------------------------------------- rank protocol


def _evidence() -> wire.ScoreEvidence:
    return wire.ScoreEvidence(
        world_size=2,
        backend="gloo",
        result_sha256="0" * 64,
        state_digest_before="a",
        state_digest_after="a",
        forward_calls=1,
        readonly_violations=(),
    )


def test_messages_cross_a_real_pipe_as_named_records() -> None:
    import multiprocessing

    parent, child = multiprocessing.Pipe(duplex=True)
    batch = {
        "token_ids": torch.tensor([[2, 5, 1]]),
        "active_mask": torch.tensor([[False, True, True]]),
    }
    try:
        wire.send(parent, wire.Score.of(batch, batch_size=1, logp_backend=hf_engine.NATIVE_LOGP))
        request = wire.receive_request(child)
        assert isinstance(request, wire.Score) and request.batch_size == 1
        assert request.logp_backend == hf_engine.NATIVE_LOGP
        got = request.tensors()
        assert set(got) == set(batch) and all(torch.equal(got[k], batch[k]) for k in batch)

        logprobs = torch.tensor([[0.0, -1.5, -0.25]])
        data = wire.result_bytes(logprobs)
        wire.send(child, wire.Scored(rank=0, pid=7, logprobs=data, evidence=_evidence()))
        reply = wire.receive_reply(parent)
        assert isinstance(reply, wire.Scored) and (reply.rank, reply.pid) == (0, 7)
        assert torch.equal(reply.result(), logprobs) and reply.evidence == _evidence()
        with pytest.raises(wire.ProtocolError, match="rank 1 sent no result"):
            wire.Scored(rank=1, pid=8, logprobs=None, evidence=_evidence()).result()

        wire.send(child, wire.Failed(rank=1, pid=8, traceback="Traceback: boom"))
        failed = wire.receive_reply(parent)
        assert isinstance(failed, wire.Failed) and failed.traceback == "Traceback: boom"
        assert (wire.Ready.KIND, wire.Scored.KIND, wire.Failed.KIND) == ("ready", "scored", "error")

        wire.send(parent, wire.Close())
        assert isinstance(wire.receive_request(child), wire.Close)
    finally:
        parent.close()
        child.close()


def test_protocol_refuses_wrong_direction_and_non_messages() -> None:
    import dataclasses
    import multiprocessing

    parent, child = multiprocessing.Pipe(duplex=True)
    try:
        parent.send(("score", b"", 1, "m:f"))  # the old positional form is not a message
        with pytest.raises(wire.ProtocolError, match="expected a request, got tuple"):
            wire.receive_request(child)
        wire.send(parent, wire.Close())
        with pytest.raises(wire.ProtocolError, match="expected a reply, got Close"):
            wire.receive_reply(child)
    finally:
        parent.close()
        child.close()
    score = wire.Score(batch=b"", batch_size=1, logp_backend="m:f")
    with pytest.raises(dataclasses.FrozenInstanceError):
        score.batch_size = 2  # type: ignore[misc]  # frozen
    with pytest.raises(TypeError):
        wire.Score(b"", 1, "m:f")  # type: ignore[misc]  # keyword-only


class _NotATensor:
    pass


def test_score_tensors_are_read_weights_only() -> None:
    import io

    buffer = io.BytesIO()
    torch.save({"token_ids": _NotATensor()}, buffer)
    with pytest.raises(TensorFormatError):
        wire.Score(batch=buffer.getvalue(), batch_size=1, logp_backend="m:f").tensors()


def test_rank_resolves_logp_backend_by_reference() -> None:
    assert resolve_logp_backend(hf_engine.NATIVE_LOGP) is hf_engine.native_selected_logprob
    assert resolve_logp_backend(fsdp_scoring.REFERENCE_LOGP) is (
        hf_engine.reference_selected_logprob
    )
    with pytest.raises(UnresolvedReference, match="expected 'module:attr'"):
        resolve_logp_backend("no_colon")
    with pytest.raises(UnresolvedReference, match="has no attribute"):
        resolve_logp_backend(f"{hf_engine.__name__}:missing")
    with pytest.raises(ValueError, match="not callable"):
        resolve_logp_backend(f"{hf_engine.__name__}:LOGPROBS_MODE")
