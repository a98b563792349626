"""A starter experiment for a checkpoint directory, a prompt file and a runtime.

Owns what ``logprob-drift init`` writes: the identity (the checkpoint directory, its tokenizer
as the prompt file's ``source`` record says it was applied, the prompt file), a baseline (the
checkpoint's own dtype on both sides plus the runtime's declared starter knobs: prefix caching
off, eager rollout, one rollout rank, unsharded SDPA training) and one intervention per
standard knob trial the runtime declares (``RuntimeInfo.interventions``), each value equal to
the baseline's left out, each with its ``description``. Reads the checkpoint's config.json for
its dtype (one line naming the file and field when it cannot). Knows nothing about engines;
the document it returns is checked by the loader like any config.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from pytest_logprob_drift.config.input_file import InputFileError, read_input
from pytest_logprob_drift.config.limits import CONFIG_JSON_LIMIT
from pytest_logprob_drift.errors import UsageError
from pytest_logprob_drift.plan.knobs import KNOBS, InvalidKnobValue
from pytest_logprob_drift.records import (
    CONFIG_SCHEMA_VERSION,
    JsonObject,
    JsonValue,
    KnobValue,
    RuntimeInfo,
    ScenarioLevel,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import Any

BATCH_SIZE = 4
"""The starter baseline's batch size (fewer when there are fewer prompts)."""
DEFAULT_MAX_NEW_TOKENS = 16
DEFAULT_SEED = 20261129
CHECKPOINT_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
"""config.json ``dtype``/``torch_dtype`` values a starter baseline takes as the checkpoint's."""


def checkpoint_dtype(checkpoint_dir: Path) -> str:
    """The dtype the checkpoint's config.json declares (``dtype``, else ``torch_dtype``;
    float32 when it declares none)."""
    config = checkpoint_dir / "config.json"
    try:
        document = json.loads(read_input(config, CONFIG_JSON_LIMIT))
    except FileNotFoundError:
        raise UsageError(f"{config}: no such file (expected a Hugging Face checkpoint)") from None
    except OSError as exc:
        raise UsageError(f"{config}: cannot be read ({exc.strerror or exc})") from None
    except InputFileError as exc:
        raise UsageError(f"{config}: cannot be read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{config}:{exc.lineno}: not JSON ({exc.msg})") from None
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"{config}: not JSON ({exc.__class__.__name__})") from None
    if not isinstance(document, dict):
        raise UsageError(f"{config}: not a JSON object")
    for key in ("dtype", "torch_dtype"):
        value = document.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or value.removeprefix("torch.") not in CHECKPOINT_DTYPES:
            known = ", ".join(CHECKPOINT_DTYPES)
            raise UsageError(
                f"{config}: {key} is {json.dumps(value)[:40]}; expected one of {known}"
            )
        return CHECKPOINT_DTYPES[value.removeprefix("torch.")]
    return "float32"


def _prompt_file_facts(prompt_file: Path) -> tuple[int, Mapping[str, JsonValue] | None]:
    """How many prompts the file holds and its ``source`` record, read loosely: the loader
    checks the file strictly once the experiment is assembled."""
    from pytest_logprob_drift.config.loader import PROMPT_FILE_LIMIT, read_input_text

    try:
        document = json.loads(read_input_text(prompt_file, PROMPT_FILE_LIMIT))
    except FileNotFoundError:
        raise UsageError(f"{prompt_file}: no such prompt file") from None
    except OSError as exc:
        raise UsageError(f"{prompt_file}: cannot be read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{prompt_file}:{exc.lineno}: not JSON ({exc.msg}, column {exc.colno})"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"{prompt_file}: cannot be read: {exc}") from None
    rows = document.get("token_ids") if isinstance(document, dict) else document
    if not isinstance(rows, list) or not rows:
        raise UsageError(
            f"{prompt_file}: expected a prompt file (an array of token-id arrays, or an object "
            "with 'token_ids', as `logprob-drift prompts` writes)"
        )
    source = document.get("source") if isinstance(document, dict) else None
    return len(rows), source if isinstance(source, dict) else None


def _safe_id(text: str) -> str:
    cleaned = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in text).strip(".-")
    return cleaned or "experiment"


def _values(path: str, values: tuple[KnobValue, ...], baseline: KnobValue | None) -> list[Any]:
    """The trial's values a knob accepts, less the baseline's (by canonical value)."""
    spec = KNOBS[path]
    kept: list[Any] = []
    for value in values:
        try:
            canonical = spec.normalize(value)
        except InvalidKnobValue:
            continue
        if baseline is not None and canonical == spec.normalize(baseline):
            continue
        kept.append(value)
    return kept


STARTER_LEVELS = (ScenarioLevel.S0, ScenarioLevel.S1)
"""The levels a starter experiment is written at: S2 and S3 name the contract's milestone
experiments (shipped under experiments/), not a user's own model."""


def starter_level(runtime: RuntimeInfo, device: str) -> ScenarioLevel:
    """The highest starter level ``runtime`` executes on ``device``; where it executes none
    there, the highest starter level it executes anywhere (the note says it is plan-only)."""
    for levels in (runtime.levels_on(device), runtime.levels):
        kept = [level for level in levels if level in STARTER_LEVELS]
        if kept:
            return kept[-1]
    return STARTER_LEVELS[0]


def starter_experiment(
    *,
    checkpoint_dir: Path,
    prompt_file: Path,
    output: Path,
    runtime: RuntimeInfo,
    experiment_id: str | None = None,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    seed: int = DEFAULT_SEED,
    device: str = "cpu",
) -> JsonObject:
    """The starter experiment document (``output``: where it will be written, so the prompt
    file is named relative to it)."""
    checkpoint_dir = checkpoint_dir.absolute()
    dtype = checkpoint_dtype(checkpoint_dir)
    prompts, source = _prompt_file_facts(prompt_file)
    name = checkpoint_dir.name
    add_special = bool(source.get("add_special_tokens", False)) if source else False
    template = source.get("chat_template_sha256") if source else None
    baseline_values: dict[str, KnobValue] = {
        "batch.size": min(BATCH_SIZE, prompts),
        "rollout.dtype": dtype,
        "training.compute_dtype": dtype,
        **dict(runtime.baseline),
    }
    baseline: dict[str, JsonObject] = {}
    for path, value in baseline_values.items():
        section, key = path.split(".", 1)
        baseline.setdefault(section, {})[key] = value
    interventions = []
    for trial in runtime.interventions:
        values = _values(trial.path, trial.values, baseline_values.get(trial.path))
        if values:
            interventions.append(
                {"path": trial.path, "values": values, "description": trial.description}
            )
    prompt_ref = _relative(prompt_file.absolute(), output.absolute().parent)
    level = starter_level(runtime, device).value
    return {
        "schema_version": CONFIG_SCHEMA_VERSION,
        "experiment_id": _safe_id(experiment_id or f"{name}-{runtime.name}"),
        "scenario_id": _safe_id(f"{name}-{runtime.name}-{device}"),
        "description": f"Starter experiment for {name} on {runtime.name}: the baseline "
        f"({dtype} on both sides) and one configuration change at a time.",
        "contract_source": "ws1",
        "contract_version": "current",
        "strategy": "one_at_a_time",
        "strict_fallback": True,
        "identity": {
            "checkpoint": {"uri": str(checkpoint_dir), "model_version": name},
            "tokenizer": {
                "id": name,
                "add_special_tokens": add_special,
                "chat_template": f"sha256:{template}" if isinstance(template, str) else None,
            },
            "prompts": {"file": prompt_ref},
            "sampling": {"seed": seed, "max_new_tokens": max_new_tokens, "temperature": 1.0},
            "mask_policy": "response_through_eos",
            "training_kv_cache": False,
            "packing": "padded",
            "positions": "from_attention_mask",
        },
        "baseline": baseline,
        "interventions": interventions,
        "scenario": {"level": level, "device": device},
    }


def _relative(path: Path, start: Path) -> str:
    """``path`` relative to ``start`` when it lies below it, else absolute."""
    try:
        return str(path.relative_to(start))
    except ValueError:
        return str(path)
