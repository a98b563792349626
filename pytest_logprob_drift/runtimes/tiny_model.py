"""The tiny local causal-LM checkpoints and checkpoint resolution.

Owns building the project's tiny checkpoints deterministically from code (config, float32
safetensors weights from a fixed seed, a byte-level BPE tokenizer whose merges are learned here
from a fixed in-code corpus): the Qwen3 one every shipped experiment uses, and tiny Llama,
Qwen2 and Mistral builds with a chat template (``TINY_ARCHITECTURES``, where what differs per
architecture is declared in one place), the checkpoint digest (the checkpoint identity), resolving a
checkpoint reference (``tiny://NAME`` or a local Hugging Face checkpoint directory) to a
verified directory, with an atomically populated on-disk cache for the tiny ones, and reading a
checkpoint's special token ids (EOS, pad) from its config, for every engine that loads it.

Knows nothing about cases, plans, engines, scoring, artifacts or pytest, and never downloads
anything: every byte of a tiny checkpoint comes from this file plus the installed torch,
transformers, tokenizers and safetensors. torch and transformers are imported only to build:
resolving an already built checkpoint (``report``'s token decoder does) needs neither.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import itertools
import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from pytest_logprob_drift.errors import DriftError, ExitCode
from pytest_logprob_drift.records import JsonObject, JsonValue
from pytest_logprob_drift.runtimes import TINY_SCHEME

__all__ = [
    "TINY_ARCHITECTURES",
    "TINY_MOE_ARCHITECTURES",
    "TINY_QWEN3_DEEP_NAME",
    "TINY_QWEN3_NAME",
    "TINY_SCHEME",
    "CheckpointError",
    "ResolvedCheckpoint",
    "TinyArchitecture",
    "build_tiny_architecture",
    "build_tiny_checkpoint",
    "checkpoint_digest",
    "default_cache_root",
    "resolve_checkpoint",
    "special_token_ids",
]

TINY_QWEN3_NAME: Final = "qwen3-h64-v1"
TINY_QWEN3_DEEP_NAME: Final = "qwen3-deep-l8-h64-v1"
"""The deep tiny Qwen3: the same tokenizer, widths and seed with 8 decoder layers, so the
layer diagnostics (``diagnostics.layers``) can say which layer drift enters at."""
DEEP_LAYERS: Final = 8
CACHE_ENV: Final = "LOGPROB_DRIFT_CACHE"

PAD_TOKEN: Final = "<|pad|>"
EOS_TOKEN: Final = "<|eos|>"
BOS_TOKEN: Final = "<|bos|>"
SPECIAL_TOKENS: Final = (PAD_TOKEN, EOS_TOKEN, BOS_TOKEN)  # ids 0, 1, 2

VOCAB_SIZE: Final = 1024
MAX_POSITIONS: Final = 512
WEIGHT_SEED: Final = 20261129

# Files that make up a checkpoint's identity (top level of the directory only).
_DIGEST_NAMES: Final = frozenset(
    {
        "config.json",
        "generation_config.json",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "merges.txt",
        "tokenizer.model",
        "chat_template.jinja",
        "chat_template.json",
    }
)
_BUILD_INFO: Final = ".build_info.json"  # cache bookkeeping, deliberately outside the digest


class CheckpointError(DriftError, ValueError):
    """A checkpoint reference cannot be resolved, or its digest is not the expected one."""

    exit_code = ExitCode.USAGE_ERROR

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """A verified checkpoint directory: where it is, its digest, and the reference it came from."""

    path: Path
    digest: str
    uri: str


# --------------------------------------------------------------------------- tokenizer


_SENTENCES: Final = (
    "The rollout engine samples a response and reports the log probability of every token.",
    "The training side recomputes the same log probabilities with a teacher forced forward pass.",
    "If the two numbers differ, on policy reinforcement learning silently becomes off policy.",
    "Tensor parallel size, context parallel size, dtype, prefix caching and graphs can all "
    "change the numerics.",
    "An attention backend, the sharding of parameters, or the batch size may move a logit.",
    "We compare every active selected token against one fixed threshold from the contract.",
    "Zero active tokens never pass; a non finite score is an invalid artifact.",
    "Checkpoint identity, tokenizer identity, masks and positions are invariants, not knobs.",
    "A small model with peaked distributions keeps the tests fast and the drift visible.",
    "Numbers such as 0 1 2 3 4 5 6 7 8 9 10 16 32 64 128 256 512 1024 appear in prompts.",
    "Questions? Answers! Lists: one, two; three (four) [five] {six} <seven> 'eight' \"nine\".",
)

_ONSETS: Final = (
    "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
    "br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "sk", "st", "th", "tr", "qu",
)  # fmt: skip
_NUCLEI: Final = ("a", "e", "i", "o", "u", "ai", "ea", "ee", "oo", "ou", "y")
_CODAS: Final = ("", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng", "ck", "x")


def _pseudo_words(count: int, seed: int) -> Iterator[str]:
    """Deterministic pronounceable pseudo-words from a 32-bit LCG (no global RNG involved)."""
    state = seed & 0xFFFFFFFF

    def draw(n: int) -> int:
        nonlocal state
        state = (1664525 * state + 1013904223) & 0xFFFFFFFF
        return (state >> 8) % n

    for _ in range(count):
        syllables = 1 + draw(3)
        parts = []
        for _ in range(syllables):
            parts.append(_ONSETS[draw(len(_ONSETS))])
            parts.append(_NUCLEI[draw(len(_NUCLEI))])
            parts.append(_CODAS[draw(len(_CODAS))])
        word = "".join(parts)
        if draw(7) == 0:
            word = word.capitalize()
        yield word


def _corpus() -> list[str]:
    lines = list(_SENTENCES)
    words = list(_pseudo_words(1200, seed=7))
    for start in range(0, len(words), 12):
        lines.append(" ".join(words[start : start + 12]) + ".")
    return lines


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what ByteLevel pre-tokenization uses)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\xa1"), ord("\xac") + 1))
        + list(range(ord("\xae"), ord("\xff") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def _learn_merges(
    words: Counter[tuple[str, ...]], initial: Iterable[str], target_size: int
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Plain BPE with a total, deterministic tie-break (highest count, then smallest pair).

    Pair counts are updated incrementally and the best pair comes from a lazily invalidated
    heap, so learning ~800 merges takes well under a second.
    """
    vocab: dict[str, int] = {}
    for token in initial:
        vocab.setdefault(token, len(vocab))
    merges: list[tuple[str, str]] = []
    seqs = [(list(word), freq) for word, freq in sorted(words.items())]
    counts: Counter[tuple[str, str]] = Counter()
    where: dict[tuple[str, str], set[int]] = {}
    for idx, (seq, freq) in enumerate(seqs):
        for pair in itertools.pairwise(seq):
            counts[pair] += freq
            where.setdefault(pair, set()).add(idx)
    heap = [(-c, pair) for pair, c in counts.items()]
    heapq.heapify(heap)
    while len(vocab) < target_size:
        while heap and (counts.get(heap[0][1], 0) != -heap[0][0] or heap[0][0] == 0):
            heapq.heappop(heap)
        if not heap:
            raise RuntimeError("tiny tokenizer corpus too small for the requested vocabulary")
        best = heapq.heappop(heap)[1]
        merged = best[0] + best[1]
        merges.append(best)
        vocab.setdefault(merged, len(vocab))
        touched: set[tuple[str, str]] = set()
        for idx in sorted(where.pop(best, set())):
            seq, freq = seqs[idx]
            for pair in itertools.pairwise(seq):
                counts[pair] -= freq
                touched.add(pair)
            i = 0
            while i < len(seq) - 1:
                if seq[i] == best[0] and seq[i + 1] == best[1]:
                    seq[i : i + 2] = [merged]
                i += 1
            for pair in itertools.pairwise(seq):
                counts[pair] += freq
                touched.add(pair)
                where.setdefault(pair, set()).add(idx)
        for pair in sorted(touched):
            if counts[pair] > 0:
                heapq.heappush(heap, (-counts[pair], pair))
    return vocab, merges


def _build_tokenizer(vocab_size: int, specials: tuple[str, ...] = SPECIAL_TOKENS) -> Tokenizer:
    """A fresh tiny tokenizer (the merges are learned once per process and arguments)."""
    return Tokenizer.from_str(_tokenizer_json(vocab_size, specials))


@functools.cache
def _tokenizer_json(vocab_size: int, specials: tuple[str, ...]) -> str:
    """The tiny tokenizer learned from the corpus, serialized: BPE learning is deterministic, so
    every build of a process shares it (a run builds the same tokenizer for several sides)."""
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    words: Counter[tuple[str, ...]] = Counter()
    for line in _corpus():
        for piece, _ in pre.pre_tokenize_str(line):
            words[tuple(piece)] += 1
    byte_map = _bytes_to_unicode()
    byte_chars = [byte_map[b] for b in range(256)]
    vocab, merges = _learn_merges(words, [*specials, *byte_chars], vocab_size)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None))
    tokenizer.pre_tokenizer = pre
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    if tokenizer.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise RuntimeError("tiny tokenizer vocabulary size mismatch")
    text: str = tokenizer.to_str()
    return text


# --------------------------------------------------------------------------- checkpoint


def _tiny_config(tokenizer: Tokenizer, layers: int = 2) -> Any:
    from pytest_logprob_drift.runtimes.transformers.library import tf

    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    return tf.Qwen3Config(
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=0.2,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        use_cache=True,
        pad_token_id=ids[PAD_TOKEN],
        eos_token_id=ids[EOS_TOKEN],
        bos_token_id=ids[BOS_TOKEN],
    )


def _save_checkpoint(
    target_dir: Path,
    model_class: Any,
    config: Any,
    tokenizer: Tokenizer,
    *,
    chat_template: str | None = None,
) -> None:
    """Seeded float32 weights of ``model_class(config)`` and the tokenizer, saved into
    ``target_dir`` (a chat template, when given, in tokenizer_config.json). The one writer of
    every tiny build; the torch RNG is left untouched."""
    import torch

    from pytest_logprob_drift.runtimes.transformers.library import model_construction, tf

    with model_construction():
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(WEIGHT_SEED)
            model = model_class(config).to(torch.float32)
        model.eval()
        model.generation_config = tf.GenerationConfig(
            bos_token_id=config.bos_token_id,
            eos_token_id=config.eos_token_id,
            pad_token_id=config.pad_token_id,
        )
        model.save_pretrained(target_dir, safe_serialization=True)
    options: JsonObject = {} if chat_template is None else {"chat_template": chat_template}
    fast = tf.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
        **options,
    )
    if chat_template is None:
        fast.save_pretrained(target_dir)
    else:
        fast.save_pretrained(target_dir, save_jinja_files=False)


def build_tiny_checkpoint(target_dir: Path, *, layers: int = 2) -> None:
    """Write the tiny Qwen3 checkpoint (``layers`` decoder layers: 2 for ``TINY_QWEN3_NAME``,
    ``DEEP_LAYERS`` for ``TINY_QWEN3_DEEP_NAME``) into ``target_dir`` (created if absent).

    Deterministic: building twice with the same installed libraries gives byte-identical files.
    The global torch RNG state is left untouched.
    """
    target_dir = Path(target_dir)
    from pytest_logprob_drift.runtimes.transformers.library import tf

    target_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _build_tokenizer(VOCAB_SIZE)
    _save_checkpoint(target_dir, tf.Qwen3ForCausalLM, _tiny_config(tokenizer, layers), tokenizer)


@dataclass(frozen=True)
class TinyArchitecture:
    """A tiny local build of one more architecture than Qwen3: the one place where what
    differs between architectures is said (beside the shared shape of ``_tiny_config``: two
    layers, hidden 128, two query heads of ``head_dim`` 64 over one KV head, which vLLM's CPU
    attention needs). ``config``: the per-architecture config fields (tied embeddings, no
    sliding window); ``chat_tokens``: special tokens its chat template writes (after pad,
    EOS, BOS); ``chat_template``: the Jinja template saved in tokenizer_config.json."""

    name: str
    config_class: str
    model_class: str
    config: Mapping[str, JsonValue]
    chat_tokens: tuple[str, ...]
    chat_template: str


_LLAMA_TEMPLATE: Final = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    "\n\n{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
_CHATML_TEMPLATE: Final = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_MISTRAL_TEMPLATE: Final = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] "
    "{{ m['content'] }} [/INST]{% elif m['role'] == 'assistant' %}{{ m['content'] }}"
    "{{ eos_token }}{% else %}{{ raise_exception('only user and assistant roles are "
    "supported') }}{% endif %}{% endfor %}"
)

TINY_ARCHITECTURES: Final = (
    TinyArchitecture(
        name="llama-h64-v1",
        config_class="LlamaConfig",
        model_class="LlamaForCausalLM",
        config={"tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False},
        chat_tokens=("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        chat_template=_LLAMA_TEMPLATE,
    ),
    TinyArchitecture(
        name="qwen2-h64-v1",
        config_class="Qwen2Config",
        model_class="Qwen2ForCausalLM",
        # Qwen2's small releases tie the LM head to the input embeddings.
        config={"tie_word_embeddings": True, "use_sliding_window": False},
        chat_tokens=("<|im_start|>", "<|im_end|>"),
        chat_template=_CHATML_TEMPLATE,
    ),
    TinyArchitecture(
        name="mistral-h64-v1",
        config_class="MistralConfig",
        model_class="MistralForCausalLM",
        # No sliding window: vLLM's CPU attention and a 512-token context need none.
        config={"tie_word_embeddings": False, "sliding_window": None},
        chat_tokens=("[INST]", "[/INST]"),
        chat_template=_MISTRAL_TEMPLATE,
    ),
)
"""The tiny builds beside Qwen3 (``tiny://NAME``), each a deterministic function of this
file and the installed libraries."""

TINY_MOE_ARCHITECTURES: Final = (
    TinyArchitecture(
        name="qwen3-moe-h128-v1",
        config_class="Qwen3MoeConfig",
        model_class="Qwen3MoeForCausalLM",
        # Every layer MoE; 128 expert rows split to 64 per rank at TP 2, a multiple of the
        # 32 vLLM's CPU expert kernels need (hidden 128 is one too).
        config={
            "tie_word_embeddings": False,
            "use_sliding_window": False,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
            "moe_intermediate_size": 128,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        },
        chat_tokens=("<|im_start|>", "<|im_end|>"),
        chat_template=_CHATML_TEMPLATE,
    ),
    TinyArchitecture(
        name="olmoe-h128-v1",
        config_class="OlmoeConfig",
        model_class="OlmoeForCausalLM",
        # OLMoE's experts take the shared ``intermediate_size`` (256: 128 per rank at TP 2);
        # its ``norm_topk_prob=False`` runs vLLM's ``renormalize=False`` path.
        config={
            "tie_word_embeddings": False,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "norm_topk_prob": False,
        },
        chat_tokens=("<|im_start|>", "<|im_end|>"),
        chat_template=_CHATML_TEMPLATE,
    ),
)
"""The tiny mixture-of-experts builds (hidden 128, head_dim 64, 4 experts, top-2, both
layers MoE), deterministic like the dense ones."""


def build_tiny_architecture(arch: TinyArchitecture, target_dir: Path) -> None:
    """Write ``arch``'s tiny checkpoint into ``target_dir``: seeded float32 weights, the
    locally learned byte-level BPE (with the chat template's special tokens) and the chat
    template. Deterministic, like ``build_tiny_checkpoint``; the torch RNG is left untouched."""
    from pytest_logprob_drift.runtimes.transformers.library import tf

    target_dir = Path(target_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _build_tokenizer(VOCAB_SIZE, (*SPECIAL_TOKENS, *arch.chat_tokens))
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    config = getattr(tf, arch.config_class)(
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=0.2,
        rms_norm_eps=1e-6,
        use_cache=True,
        pad_token_id=ids[PAD_TOKEN],
        eos_token_id=ids[EOS_TOKEN],
        bos_token_id=ids[BOS_TOKEN],
        **arch.config,
    )
    _save_checkpoint(
        target_dir,
        getattr(tf, arch.model_class),
        config,
        tokenizer,
        chat_template=arch.chat_template,
    )


def _digest_files(model_dir: Path) -> list[Path]:
    return sorted(
        (
            p
            for p in model_dir.iterdir()
            if p.is_file() and (p.name in _DIGEST_NAMES or p.name.endswith(".safetensors"))
        ),
        key=lambda p: p.name,
    )


def checkpoint_digest(model_dir: Path) -> str:
    """SHA-256 (hex) over the sorted names and contents of the checkpoint's identity files.

    Covered: config.json, generation_config.json, ``*.safetensors`` (+ their index), and the
    tokenizer files, top level only. Each file contributes its name, its size and its bytes, so
    the encoding is unambiguous.
    """
    model_dir = Path(model_dir)
    h = hashlib.sha256(b"pytest-logprob-drift.checkpoint.v1\0")
    for path in _digest_files(model_dir):
        h.update(path.name.encode() + b"\0")
        h.update(path.stat().st_size.to_bytes(8, "little"))
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------- resolution


def default_cache_root() -> Path:
    """``$LOGPROB_DRIFT_CACHE`` or ``~/.cache/pytest-logprob-drift``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "pytest-logprob-drift"


_TINY_BUILDERS: Final[Mapping[str, Callable[[Path], None]]] = {
    TINY_QWEN3_NAME: build_tiny_checkpoint,
    TINY_QWEN3_DEEP_NAME: functools.partial(build_tiny_checkpoint, layers=DEEP_LAYERS),
    **{
        arch.name: functools.partial(build_tiny_architecture, arch)
        for arch in (*TINY_ARCHITECTURES, *TINY_MOE_ARCHITECTURES)
    },
}


def _build_env(name: str) -> dict[str, str]:
    """The recipe and the versions of the libraries a build depends on, read from the installed
    distributions' metadata (equal to the packages' ``__version__``) so that resolving a cached
    checkpoint imports neither torch nor transformers (``report``'s token decoder resolves one)."""
    import importlib.metadata

    return {
        "recipe": name,
        **{lib: importlib.metadata.version(lib) for lib in ("torch", "transformers", "tokenizers")},
    }


def _read_info(path: Path) -> dict[str, object] | None:
    try:
        info = json.loads((path / _BUILD_INFO).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _verified(path: Path, name: str) -> str | None:
    """The digest of cached dir ``path`` if its content still matches its name and record."""
    info = _read_info(path)
    if info is None or info.get("env") != _build_env(name):
        return None
    digest = checkpoint_digest(path)
    if digest != info.get("digest") or not path.name.endswith("-" + digest[:16]):
        return None
    return digest


def _discard(path: Path) -> None:
    """Remove a (stale or tampered) cache dir; rename first so readers never see half of it."""
    trash = path.with_name(f".trash-{path.name}-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        path.rename(trash)
    except OSError:
        return  # someone else already moved it
    shutil.rmtree(trash, ignore_errors=True)


def _resolve_tiny(name: str, uri: str, cache_root: Path) -> tuple[Path, str]:
    builder = _TINY_BUILDERS.get(name)
    if builder is None:
        known = ", ".join(TINY_SCHEME + n for n in sorted(_TINY_BUILDERS))
        raise CheckpointError(f"unknown tiny checkpoint {uri!r} (known: {known})")
    prefix = f"tiny-{name}-"
    cache_root.mkdir(parents=True, exist_ok=True)
    env = _build_env(name)
    for candidate in sorted(cache_root.glob(prefix + "*")):
        if not candidate.is_dir():
            continue
        info = _read_info(candidate)
        if info is not None and info.get("env") != env:
            continue  # built by other library versions: leave it to them
        digest = _verified(candidate, name)
        if digest is not None:
            return candidate, digest
        _discard(candidate)  # tampered or half-written: rebuild below
    tmp = Path(tempfile.mkdtemp(prefix=f".build-{name}-", dir=cache_root))
    try:
        builder(tmp)
        digest = checkpoint_digest(tmp)
        (tmp / _BUILD_INFO).write_text(
            json.dumps({"digest": digest, "env": env, "uri": uri}, sort_keys=True) + "\n"
        )
        final = cache_root / f"{prefix}{digest[:16]}"
        for _ in range(3):
            try:
                tmp.rename(final)
                return final, digest
            except OSError:
                # A concurrent builder got there first: its bytes are ours if it verifies.
                if final.is_dir() and checkpoint_digest(final) == digest:
                    return final, digest
                _discard(final)
        raise CheckpointError(f"cannot publish the tiny checkpoint into {final}")
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def resolve_checkpoint(
    uri_or_path: str, *, expected_digest: str | None, cache_root: Path | None = None
) -> ResolvedCheckpoint:
    """Resolve ``tiny://NAME`` (built once into the cache) or a local HF checkpoint directory.

    Relative directory paths are used as given (the caller resolves them). Raises
    CheckpointError for an unknown tiny name, a missing directory or one without config.json,
    or a digest that differs from ``expected_digest``.
    """
    if uri_or_path.startswith(TINY_SCHEME):
        root = Path(cache_root) if cache_root is not None else default_cache_root()
        path, digest = _resolve_tiny(uri_or_path[len(TINY_SCHEME) :], uri_or_path, root)
    else:
        path = Path(uri_or_path)
        if not path.is_dir():
            raise CheckpointError(f"checkpoint directory {uri_or_path!r} does not exist")
        if not (path / "config.json").is_file():
            raise CheckpointError(
                f"checkpoint directory {uri_or_path!r} has no config.json "
                "(expected a local Hugging Face checkpoint directory)"
            )
        digest = checkpoint_digest(path)
    if expected_digest is not None and expected_digest != digest:
        raise CheckpointError(
            f"checkpoint {uri_or_path!r} has digest {digest}, expected {expected_digest}"
        )
    return ResolvedCheckpoint(path=path, digest=digest, uri=uri_or_path)


def special_token_ids(model_dir: Path) -> tuple[int, int]:
    """``(eos_token_id, pad_token_id)`` from a checkpoint's config.json.

    A list of EOS ids yields its first; a checkpoint without a pad id pads with EOS.
    """
    config = json.loads((Path(model_dir) / "config.json").read_text())
    eos = config.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    pad = config.get("pad_token_id")
    return int(eos), int(pad if pad is not None else eos)
