"""``training.attention_backend=flash_attention_2`` is offered only where it can apply.

transformers' ``flash_attention_2`` needs the ``flash_attn`` package (no extra of this project
installs it) and a cuda device. Where the package is absent the ``hf`` runtime declares the
value unsupported at materialization, naming why, so strict execution rejects the case before
any engine is built; ``load_model`` refuses it with the same reason, and on cpu even with the
package. Other implementations are unaffected.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from drift_testing import EXPERIMENTS, make_runner

from pytest_logprob_drift import plan_file
from pytest_logprob_drift.outcomes import Outcome
from pytest_logprob_drift.records import ApplicationStatus
from pytest_logprob_drift.runtimes.tiny_model import resolve_checkpoint
from pytest_logprob_drift.runtimes.transformers import engine as hf_engine
from pytest_logprob_drift.runtimes.transformers.adapter import HfAdapter

HAS_FLASH_ATTN = importlib.util.find_spec("flash_attn") is not None
NOT_INSTALLED = "flash-attn is not installed here"


def test_only_implementations_that_can_apply_are_offered() -> None:
    for name in ("eager", "sdpa"):
        assert hf_engine.attention_unavailable(name) is None
        assert hf_engine.attention_unavailable(name, "cpu") is None
    why = hf_engine.attention_unavailable("flash_attention_2")
    if HAS_FLASH_ATTN:
        assert why is None
        cpu = hf_engine.attention_unavailable("flash_attention_2", "cpu")
        assert cpu == "flash_attention_2 needs a cuda device, not 'cpu'"
    else:
        assert why is not None and why.startswith(NOT_INSTALLED)
    adapter = HfAdapter()
    done = adapter.materialize(
        {"training.attention_backend": "flash_attention_2", "training.compute_dtype": "bfloat16"}
    )
    flash = done["training.attention_backend"]
    if HAS_FLASH_ATTN:
        assert flash.status is ApplicationStatus.APPLIED
    else:
        assert flash.status is ApplicationStatus.UNSUPPORTED
        assert flash.evidence.startswith("training.attention_backend='flash_attention_2': ")
        assert NOT_INSTALLED in flash.evidence
    assert done["training.compute_dtype"].status is ApplicationStatus.APPLIED
    sdpa = adapter.materialize({"training.attention_backend": "sdpa"})
    assert sdpa["training.attention_backend"].status is ApplicationStatus.APPLIED


def test_load_model_refuses_flash_attention_where_it_cannot_apply() -> None:
    checkpoint = resolve_checkpoint("tiny://qwen3-h64-v1", expected_digest=None)
    expected = "needs a cuda device" if HAS_FLASH_ATTN else NOT_INSTALLED
    with pytest.raises(
        ValueError, match=f"unsupported attn_implementation 'flash_attention_2': {expected}"
    ):
        hf_engine.load_model(
            checkpoint.path, dtype="bfloat16", attn_implementation="flash_attention_2"
        )


@pytest.mark.skipif(HAS_FLASH_ATTN, reason="flash_attn is installed: the case would execute")
def test_a_flash_attention_case_is_rejected_before_any_engine_is_built(tmp_path: Path) -> None:
    document = json.loads((EXPERIMENTS / "cross_config_s0_hf_cuda_bf16.json").read_text())
    document["interventions"] = [
        {"path": "training.attention_backend", "values": ["flash_attention_2"]}
    ]
    config = tmp_path / "flash.json"
    config.write_text(json.dumps(document))
    plan = plan_file(str(config))
    (flash,) = [ec for ec in plan.cases if ec.case.label != "baseline"]
    with make_runner(plan, runtime="hf", artifacts=tmp_path / "runs") as runner:
        (result,) = runner.run([flash])
        built = (runner.pool.rollout_constructions, runner.pool.training_constructions)
    assert result.outcome is Outcome.STRICT_REJECTED, result.reason
    assert "training.attention_backend='flash_attention_2': unsupported" in result.reason
    assert NOT_INSTALLED in result.reason
    assert built == (0, 0)  # refused at materialization: nothing was loaded (no GPU needed)
