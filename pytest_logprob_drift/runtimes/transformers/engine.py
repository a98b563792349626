"""Rollout generation and teacher-forced scoring with plain transformers.

Owns loading a local Hugging Face causal LM with an exact dtype and attention implementation
(and reading back what the live model really has), the rollout side (its own decode loop on
the KV-cache path with per-sample seeded sampling, reporting raw selected-token logprobs), the
read-only training scorer (one teacher-forced forward per right-padded chunk, no cache), the two
built-in selected-logprob functions and their ``module:attr`` references, and the checks of the
canonical batch the scorer accepts. The canonical batch itself (its tensors and which tokens are
active under the identity's mask policy) is ``runtimes.batch``'s.

Knows nothing about cases, plans, knobs, thresholds, comparison, artifacts, processes or pytest,
and never downloads anything (models load with ``local_files_only=True``).
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import torch
from torch import Tensor

from pytest_logprob_drift.numerics.sampling import Truncation, processed_logits
from pytest_logprob_drift.records import MaskPolicy
from pytest_logprob_drift.runtimes.batch import (
    CANONICAL_KEYS,
    canonical_batch,
    validate_rollout_request,
)
from pytest_logprob_drift.runtimes.transformers.library import model_construction, tf
from pytest_logprob_drift.runtimes.transformers.logs import transformers_output

__all__ = [
    "ATTN_IMPLEMENTATIONS",
    "CANONICAL_KEYS",
    "DTYPES",
    "LM_HEAD_DTYPES",
    "LOGPROBS_MODE",
    "NATIVE_LOGP",
    "REFERENCE_LOGP",
    "SCORER_KEYS",
    "DeviceUnavailable",
    "LogpFn",
    "attention_unavailable",
    "check_device",
    "check_dtype_and_attention",
    "dtype_name",
    "hf_rollout",
    "hf_teacher_forced_score",
    "live_device",
    "lm_head_at_score",
    "load_model",
    "native_selected_logprob",
    "read_back",
    "reference_selected_logprob",
    "sample_seed",
    "validate_canonical_batch",
]

LogpFn = Callable[[Tensor, Tensor], Tensor]
"""``(logits [..., V], token_ids [...]) -> float32 [...]``: the selected-token logprob."""

DTYPES: Final[Mapping[str, torch.dtype]] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
ATTN_IMPLEMENTATIONS: Final = ("eager", "sdpa", "flex_attention", "flash_attention_2")
"""What ``load_model`` may be asked for; ``attention_unavailable`` says which of them cannot
apply in this environment (``flash_attention_2`` needs the ``flash_attn`` package and cuda)."""
FLASH_ATTN_PACKAGE: Final = "flash_attn"
LOGPROBS_MODE: Final = "raw_logprobs"
"""What the rollout reports by default: logprobs of the raw logits (before temperature), as vLLM
names it."""
LOGPROBS_MODES: Final = ("raw_logprobs", "processed_logprobs")
"""What the rollout can report: the raw logits' logprobs, or those of the processed logits it
samples from (temperature and truncation applied, ``numerics.sampling``), as vLLM names them."""

NATIVE_LOGP: Final = f"{__name__}:native_selected_logprob"
REFERENCE_LOGP: Final = f"{__name__}:reference_selected_logprob"
"""``module:attr`` references of the built-in functions (what a rank process imports)."""

SCORER_KEYS: Final = ("token_ids", "attention_mask", "active_mask", "position_ids")
"""The canonical batch tensors the teacher-forced scorer reads (the rest it never sees)."""


# --------------------------------------------------------------------------- selected logprob


def native_selected_logprob(logits: Tensor, token_ids: Tensor) -> Tensor:
    """``log_softmax`` in the logits' own dtype, gather, then ``.float()`` (no upcast)."""
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, token_ids.long().unsqueeze(-1)).squeeze(-1).float()


def reference_selected_logprob(logits: Tensor, token_ids: Tensor) -> Tensor:
    """``log_softmax(logits.float())`` then gather: the float32 reference."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, token_ids.long().unsqueeze(-1)).squeeze(-1)


def _selected(logp_fn: LogpFn, logits: Tensor, token_ids: Tensor) -> Tensor:
    out = logp_fn(logits, token_ids)
    if not isinstance(out, Tensor) or out.shape != token_ids.shape:
        got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ValueError(
            f"selected-logprob function returned {got}, expected shape {tuple(token_ids.shape)}"
        )
    if out.dtype != torch.float32:
        raise ValueError(f"selected-logprob function returned {out.dtype}, expected float32")
    return out


# --------------------------------------------------------------------------- model loading


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def live_device(model: Any) -> torch.device:
    """The device the live model's parameters are on (``next(model.parameters()).device``);
    cpu for a model without parameters."""
    for p in model.parameters():
        return torch.device(p.device)
    return torch.device("cpu")


class DeviceUnavailable(ValueError):
    """The requested device does not exist in this torch build or on this machine."""


def check_device(device: str) -> torch.device:
    """``torch.device(device)`` when this process can place a model there; else
    ``DeviceUnavailable`` naming the device and why (a CPU build of torch, or no visible GPU)."""
    try:
        torch_device = torch.device(device)
    except RuntimeError as exc:
        raise DeviceUnavailable(f"unknown device {device!r}: {exc}") from None
    if torch_device.type == "cuda":
        if torch.version.cuda is None and torch.version.hip is None:
            raise DeviceUnavailable(
                f"device {device!r} needs a CUDA build of torch; this is torch "
                f"{torch.__version__} built without CUDA"
            )
        if not torch.cuda.is_available():
            raise DeviceUnavailable(
                f"device {device!r}: torch {torch.__version__} sees no CUDA device "
                "(no GPU visible to this process)"
            )
    elif torch_device.type != "cpu":
        raise DeviceUnavailable(f"device {device!r} is not supported (cpu or cuda)")
    return torch_device


LM_HEAD_DTYPES: Final = ("float32", "compute")
"""The LM head (and so the logits) in float32, or in the model's compute dtype."""


def _lm_head(model: Any) -> Any:
    get = getattr(model, "get_output_embeddings", None)
    return get() if callable(get) else None


def _unloaded(model: Any) -> str | None:
    """Why the loaded model is not whole (None: it is): a parameter left on the meta device
    (transformers builds there and fills from the files; a tied LM head the files do not hold
    is left there when the tie did not happen)."""
    for name, param in model.named_parameters(remove_duplicate=False):
        if param.device.type == "meta":
            return f"parameter {name!r} holds no data (left on the meta device)"
    return None


def read_back(model: Any) -> dict[str, object]:
    """What the live model actually has (never what was asked for): ``param_dtype`` is the
    body's (every parameter but the LM head's), ``lm_head_dtype`` the LM head weight's."""
    params = list(model.parameters())
    head = _lm_head(model)
    head_ids = {id(p) for p in head.parameters()} if head is not None else set()
    body = [p for p in params if id(p) not in head_ids] or params
    dtypes = sorted({dtype_name(p.dtype) for p in body})
    head_weight = getattr(head, "weight", None)
    return {
        "param_dtype": dtypes[0] if len(dtypes) == 1 else ",".join(dtypes),
        "lm_head_dtype": dtype_name(head_weight.dtype) if head_weight is not None else "none",
        "attn_implementation": str(model.config._attn_implementation),
        "device": str(params[0].device) if params else "none",
        "num_parameters": int(sum(p.numel() for p in params)),
        "training": bool(model.training),
    }


def attention_unavailable(attn_implementation: str, device: str | None = None) -> str | None:
    """Why this attention implementation cannot apply here (None: it can). ``flash_attention_2``
    needs the ``flash_attn`` package, which no extra of this project installs (looked up
    without importing it), and a cuda device; ``flex_attention`` does not run on cpu (see
    ``load_model``). ``device`` None: only what does not depend on the device."""
    if attn_implementation == "flash_attention_2":
        if importlib.util.find_spec(FLASH_ATTN_PACKAGE) is None:
            return (
                "flash-attn is not installed here (transformers' flash_attention_2 needs the "
                "flash_attn package; no extra of this project installs it)"
            )
        if device is not None and torch.device(device).type != "cuda":
            return f"flash_attention_2 needs a cuda device, not {device!r}"
    return None


def check_dtype_and_attention(dtype: str, attn_implementation: str) -> None:
    """Raise ValueError naming the value unless both are ones this module can load."""
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r} (supported: {', '.join(DTYPES)})")
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"unsupported attn_implementation {attn_implementation!r} "
            f"(supported: {', '.join(ATTN_IMPLEMENTATIONS)})"
        )


def _float32_lm_head(model: Any) -> None:
    """The LM head in float32 while the body keeps its dtype (TRL's ``cast_lm_head_to_fp32``):
    an untied float32 copy of the head weight, and the final hidden states upcast on their
    way in, so the logits are computed and returned in float32."""
    head = _lm_head(model)
    if head is None or not isinstance(getattr(head, "weight", None), torch.nn.Parameter):
        raise ValueError("the model has no LM head weight to cast to float32")
    head.weight = torch.nn.Parameter(head.weight.detach().float().clone(), requires_grad=False)
    if getattr(head, "bias", None) is not None:
        head.bias = torch.nn.Parameter(head.bias.detach().float().clone(), requires_grad=False)

    def upcast(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (args[0].float(), *args[1:])

    head.register_forward_pre_hook(upcast)


@contextmanager
def lm_head_at_score(model: Any, lm_head_dtype: str) -> Iterator[list[str]]:
    """For the duration, the LM head's output is observed and, with ``lm_head_dtype="float32"``
    on a model whose head is not float32, recomputed in float32: ``F.linear`` of the upcast
    final hidden states and a float32 copy of the head weight (the same arithmetic as
    ``load_model``'s float32 head, which an FSDP-sharded model cannot hold: its parameter
    groups need one dtype). Yields a list receiving the dtype name of every logits tensor
    the head produced. Changes no parameter or buffer."""
    if lm_head_dtype not in LM_HEAD_DTYPES:
        raise ValueError(f"lm_head_dtype must be one of {', '.join(LM_HEAD_DTYPES)}")
    head = _lm_head(model)
    if head is None:
        raise ValueError("the model has no LM head")
    seen: list[str] = []

    def output(module: Any, args: tuple[Any, ...], out: Any) -> Any:
        weight = module.weight
        if lm_head_dtype == "float32" and weight.dtype != torch.float32:
            bias = getattr(module, "bias", None)
            out = torch.nn.functional.linear(
                args[0].float(), weight.float(), None if bias is None else bias.float()
            )
        seen.append(dtype_name(out.dtype))
        return out

    handle = head.register_forward_hook(output)
    try:
        yield seen
    finally:
        handle.remove()


def load_model(
    model_dir: Path,
    *,
    dtype: str,
    attn_implementation: str,
    device: str = "cpu",
    lm_head_dtype: str = "compute",
) -> Any:
    """Load a local checkpoint in eval mode with exactly this dtype and attention implementation
    (and, with ``lm_head_dtype="float32"``, a float32 LM head).

    Raises ValueError naming the offending value for an unknown dtype or attention
    implementation, for a combination this device cannot run, and when the live model does not
    have what was asked for (a silent fallback is an error, never a result).
    """
    check_dtype_and_attention(dtype, attn_implementation)
    torch_device = check_device(device)
    if (why := attention_unavailable(attn_implementation, device)) is not None:
        raise ValueError(f"unsupported attn_implementation {attn_implementation!r}: {why}")
    if torch_device.type == "cpu" and attn_implementation == "flex_attention":
        # Measured with torch 2.13 CPU / transformers 5.19: the teacher-forced forward compiles
        # through inductor (~11 s) and the KV-cache decode step fails with a C++ compile error.
        raise ValueError(
            "unsupported combination: attn_implementation 'flex_attention' on device 'cpu' "
            "(use 'eager' or 'sdpa' on CPU)"
        )
    try:
        with model_construction(), transformers_output():
            model = tf.AutoModelForCausalLM.from_pretrained(
                Path(model_dir),
                dtype=DTYPES[dtype],
                attn_implementation=attn_implementation,
                local_files_only=True,
            )
    except (ImportError, ValueError, RuntimeError) as exc:
        raise ValueError(
            f"cannot load {model_dir} with dtype {dtype!r} and attn_implementation "
            f"{attn_implementation!r}: {exc}"
        ) from exc
    if (why := _unloaded(model)) is not None:
        raise ValueError(f"{model_dir} did not load whole: {why}")
    if lm_head_dtype not in LM_HEAD_DTYPES:
        raise ValueError(f"lm_head_dtype must be one of {', '.join(LM_HEAD_DTYPES)}")
    if lm_head_dtype == "float32" and dtype != "float32":
        _float32_lm_head(model)
    model.to(torch_device)
    model.eval()
    actual = read_back(model)
    if actual["param_dtype"] != dtype or actual["attn_implementation"] != attn_implementation:
        raise ValueError(
            f"model loaded with dtype {actual['param_dtype']!r} and attn_implementation "
            f"{actual['attn_implementation']!r}, requested {dtype!r} and {attn_implementation!r}"
        )
    want_head = "float32" if lm_head_dtype == "float32" else dtype
    if actual["lm_head_dtype"] not in (want_head, "none"):
        raise ValueError(
            f"model loaded with an LM head in {actual['lm_head_dtype']!r}, expected {want_head!r}"
        )
    return model


# --------------------------------------------------------------------------- rollout


def sample_seed(seed: int, sample_index: int) -> int:
    """The 63-bit generator seed of one sample: independent of batching and of other samples."""
    digest = hashlib.sha256(f"hf_rollout:{seed}:{sample_index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _sample(
    logits: Tensor, processed: Tensor, generators: Sequence[torch.Generator], temperature: float
) -> Tensor:
    """One token per row: greedy at temperature 0, else Gumbel-max over the ``processed``
    logits (temperature and truncation applied) with the row's generator.

    The noise is drawn on CPU from each sample's own generator (a fixed amount per step), so a
    sample's token stream depends only on its seed and its logits, never on its batch mates.
    """
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    vocab = logits.shape[-1]
    noise = torch.stack(
        [
            -torch.log(-torch.log(torch.rand(vocab, generator=g).clamp_(min=1e-20)))
            for g in generators
        ]
    ).to(logits.device)
    return (processed + noise).argmax(dim=-1)


def _left_padded(
    prompts: Sequence[Sequence[int]], pad_token_id: int, device: torch.device
) -> tuple[Tensor, Tensor, Tensor]:
    """A prompt chunk, left-padded: token ids, attention mask (int64) and position ids."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        ids[i, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
        mask[i, width - len(prompt) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), positions.to(device)


def _cached_forward(model: Any, ids: Tensor, mask: Tensor, positions: Tensor, cache: Any) -> Tensor:
    """One forward through the KV cache (prefill or one decode step): last-position logits."""
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    logits: Tensor = out.logits[:, -1, :]
    return logits


@dataclass(frozen=True, slots=True, kw_only=True)
class _Decoding:
    """How every chunk of one rollout decodes (what ``hf_rollout`` was asked for)."""

    seed: int
    max_new_tokens: int
    temperature: float
    eos_token_id: int
    pad_token_id: int
    logp_fn: LogpFn
    truncation: Truncation
    logprobs_mode: str = LOGPROBS_MODE
    steps: list[list[Tensor]] | None = None
    """When given: per sample, the distribution each generated token's logprob was taken from
    (raw logits, or the float32 processed logits), one ``[V]`` row per step."""


def _rollout_chunk(
    model: Any, prompts: Sequence[Sequence[int]], first_index: int, how: _Decoding
) -> list[tuple[list[int], list[float]]]:
    ids, mask, positions = _left_padded(prompts, how.pad_token_id, live_device(model))
    generators = [
        torch.Generator(device="cpu").manual_seed(sample_seed(how.seed, first_index + i))
        for i in range(len(prompts))
    ]
    cache = tf.DynamicCache(config=model.config)
    logits = _cached_forward(model, ids, mask, positions, cache)
    generated: list[tuple[list[int], list[float]]] = [([], []) for _ in prompts]
    done = [False] * len(prompts)
    last_pos = positions[:, -1:]
    for step in range(how.max_new_tokens):
        processed = processed_logits(logits, how.truncation)
        tokens = _sample(logits, processed, generators, how.temperature)
        reported = processed if how.logprobs_mode == "processed_logprobs" else logits
        logps = _selected(how.logp_fn, reported, tokens).cpu()
        for i, token in enumerate(tokens.cpu().tolist()):
            if not done[i]:
                generated[i][0].append(int(token))
                generated[i][1].append(float(logps[i]))
                if how.steps is not None:
                    how.steps[first_index + i].append(reported[i].cpu())
                done[i] = token == how.eos_token_id
        if all(done) or step == how.max_new_tokens - 1:
            break
        last_pos = last_pos + 1
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        logits = _cached_forward(model, tokens.unsqueeze(1), mask, last_pos, cache)
    return generated


def hf_rollout(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    seed: int,
    max_new_tokens: int,
    temperature: float,
    eos_token_id: int,
    pad_token_id: int,
    batch_size: int,
    logp_fn: LogpFn,
    mask_policy: MaskPolicy = MaskPolicy.RESPONSE_THROUGH_EOS,
    truncation: Truncation | None = None,
    logprobs_mode: str = LOGPROBS_MODE,
    steps: list[list[Tensor]] | None = None,
) -> dict[str, Tensor]:
    """Sample responses on the KV-cache decode path; return the canonical batch (on CPU).

    Per chunk of ``batch_size`` samples: one prefill forward of the left-padded prompts, then
    one token per step through a ``DynamicCache``. Sample ``i`` draws from its own generator
    seeded by ``sample_seed(seed, i)``; ``temperature == 0`` is greedy. A sample stops after its
    first EOS (which is kept, and scored unless ``mask_policy`` is ``response_before_eos``).
    Tokens are drawn from the processed logits (``truncation``: temperature, min_p, top_k,
    top_p; ``numerics.sampling``). The reported logprob of each sampled token is
    ``logp_fn(raw step logits, token)`` in the model's native logits dtype under
    ``raw_logprobs`` (``LOGPROBS_MODE``), ``logp_fn(processed logits, token)`` under
    ``processed_logprobs``. ``steps``, when given (a list), receives per sample the rows of the
    distribution each reported logprob was taken from.
    """
    validate_rollout_request(
        prompts, batch_size=batch_size, max_new_tokens=max_new_tokens, temperature=temperature
    )
    if logprobs_mode not in LOGPROBS_MODES:
        raise ValueError(f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}")
    if steps is not None:
        steps[:] = [[] for _ in prompts]
    how = _Decoding(
        seed=seed,
        max_new_tokens=max_new_tokens,
        temperature=float(temperature),
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        logp_fn=logp_fn,
        truncation=truncation or Truncation(temperature=float(temperature)),
        logprobs_mode=logprobs_mode,
        steps=steps,
    )
    responses: list[tuple[list[int], list[float]]] = []
    with torch.inference_mode():
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            responses.extend(_rollout_chunk(model, chunk, start, how))
    return canonical_batch(
        prompts, responses, pad_token_id, eos_token_id=eos_token_id, mask_policy=mask_policy
    )


def hf_forced_decode(
    model: Any,
    batch: Mapping[str, Tensor],
    *,
    batch_size: int,
    logp_fn: LogpFn,
    pad_token_id: int,
    truncation: Truncation,
    logprobs_mode: str = LOGPROBS_MODE,
) -> tuple[Tensor, Tensor]:
    """Decode replay: the canonical batch's sampled responses forced through the rollout's
    KV-cache decode path again, exactly as ``hf_rollout`` decodes (chunks of ``batch_size``,
    left-padded prompt prefill, then one token per step through a ``DynamicCache``), each step
    feeding the sampled token instead of drawing one (a finished row is fed the pad token).
    Returns float32 ``[B, L]`` logprobs of the sampled tokens on the batch's grid (0.0 outside
    ``active_mask``; raw or processed as ``logprobs_mode``) and the int64 ``[B, L]`` token ids
    fed (the prompt, then the forced tokens; pad elsewhere)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    token_ids, attention = batch["token_ids"].cpu(), batch["attention_mask"].cpu()
    active = batch["active_mask"].cpu()
    prompt_lengths = [int(n) for n in batch["prompt_lengths"].tolist()]
    lengths = [int(n) for n in attention.sum(-1).tolist()]
    rows, width = token_ids.shape
    result = torch.zeros((rows, width), dtype=torch.float32)
    fed = torch.full((rows, width), pad_token_id, dtype=torch.long)
    device = live_device(model)
    with torch.inference_mode():
        for start in range(0, rows, batch_size):
            chunk = range(start, min(start + batch_size, rows))
            prompts = [token_ids[i, : prompt_lengths[i]].tolist() for i in chunk]
            responses = [token_ids[i, prompt_lengths[i] : lengths[i]].tolist() for i in chunk]
            for i, prompt in zip(chunk, prompts, strict=True):
                fed[i, : len(prompt)] = torch.tensor(prompt, dtype=torch.long)
            ids, mask, positions = _left_padded(prompts, pad_token_id, device)
            cache = tf.DynamicCache(config=model.config)
            logits = _cached_forward(model, ids, mask, positions, cache)
            last_pos = positions[:, -1:]
            steps = max(len(r) for r in responses)
            for step in range(steps):
                forced = torch.tensor(
                    [r[step] if step < len(r) else pad_token_id for r in responses],
                    dtype=torch.long,
                    device=logits.device,
                )
                reported = (
                    processed_logits(logits, truncation)
                    if logprobs_mode == "processed_logprobs"
                    else logits
                )
                logps = _selected(logp_fn, reported, forced).cpu()
                for j, i in enumerate(chunk):
                    if step < len(responses[j]):
                        position = prompt_lengths[i] + step
                        fed[i, position] = int(forced[j])
                        if bool(active[i, position]):
                            result[i, position] = float(logps[j])
                if step == steps - 1:
                    break
                last_pos = last_pos + 1
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                logits = _cached_forward(model, forced.unsqueeze(1), mask, last_pos, cache)
    return result, fed


# --------------------------------------------------------------------------- training scorer


def validate_canonical_batch(batch: Mapping[str, Tensor]) -> None:
    """Raise ValueError unless ``batch`` has the scorer's canonical, right-padded tensors."""
    missing = [k for k in SCORER_KEYS if k not in batch]
    if missing:
        raise ValueError(f"batch lacks {', '.join(missing)}")
    token_ids, attention = batch["token_ids"], batch["attention_mask"]
    if token_ids.dim() != 2 or token_ids.dtype != torch.long:
        raise ValueError(f"token_ids must be int64 [B, L], got {token_ids.dtype} {token_ids.shape}")
    expected = {"attention_mask": torch.bool, "active_mask": torch.bool, "position_ids": torch.long}
    for key, dtype in expected.items():
        t = batch[key]
        if t.shape != token_ids.shape or t.dtype != dtype:
            raise ValueError(
                f"{key} must be {dtype_name(dtype)} {tuple(token_ids.shape)}, "
                f"got {dtype_name(t.dtype)} {tuple(t.shape)}"
            )
    attention = attention.cpu()
    lengths = attention.sum(-1)
    prefix = torch.arange(token_ids.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
    if not torch.equal(prefix, attention):
        raise ValueError("attention_mask is not right-padded (a True prefix per row)")
    active = batch["active_mask"].cpu()
    if bool((active & ~attention).any()):
        raise ValueError("active_mask marks padding positions")
    if token_ids.shape[1] > 0 and bool(active[:, 0].any()):
        raise ValueError("active_mask marks position 0, which has no preceding token")


def hf_teacher_forced_score(
    model: Any,
    batch: Mapping[str, Tensor],
    *,
    batch_size: int,
    logp_fn: LogpFn,
    processed: Truncation | None = None,
    full_vocab: list[Tensor] | None = None,
) -> Tensor:
    """Read-only teacher-forced scoring of the canonical batch; float32 ``[B, L]`` on CPU.

    One forward per right-padded chunk of ``batch_size`` rows (trimmed to the chunk's longest
    row) with the batch's attention mask and position ids and ``use_cache=False``; the logits
    at ``t - 1`` score ``token_ids[:, t]``. Values at active positions, 0.0 elsewhere. With
    ``processed`` the scored logits are first processed like the sampler's (temperature and
    truncation renormalization, ``numerics.sampling``), otherwise they are the raw logits.
    ``full_vocab``, when given (a list), receives the scored ``[V]`` rows of the active
    positions, one ``[A_chunk, V]`` tensor per chunk in row-major order. Never generates, never
    touches an optimizer, never changes the model's train/eval mode.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    validate_canonical_batch(batch)
    token_ids = batch["token_ids"]
    rows, width = token_ids.shape
    result = torch.zeros((rows, width), dtype=torch.float32)
    device = live_device(model)
    mode = model.training
    with torch.no_grad():
        for start in range(0, rows, batch_size):
            stop = min(start + batch_size, rows)
            length = int(batch["attention_mask"][start:stop].sum(-1).max())
            if length < 2:
                continue
            ids = token_ids[start:stop, :length].to(device)
            out = model(
                input_ids=ids,
                attention_mask=batch["attention_mask"][start:stop, :length].long().to(device),
                position_ids=batch["position_ids"][start:stop, :length].to(device),
                use_cache=False,
            )
            scored = out.logits[:, :-1, :]
            if processed is not None:
                scored = processed_logits(scored, processed)
            logp = _selected(logp_fn, scored, ids[:, 1:]).cpu()
            active = batch["active_mask"][start:stop, 1:length].cpu()
            result[start:stop, 1:length] = torch.where(active, logp, torch.zeros_like(logp))
            if full_vocab is not None:
                full_vocab.append(scored[active.to(scored.device)].cpu())
    if model.training != mode:
        raise RuntimeError("the training scorer changed the model's train/eval mode")
    return result
