"""Strict loading of ``cross_config.experiment_config.v1`` documents.

Owns the external schema: which keys exist, their JSON types, and turning a file into an
``ExperimentConfig``. Every fault is a ``ConfigError`` naming the JSON path (``$.baseline.
rollout.dtype``) and what was expected; all faults of a document are reported together. Knob
values stay raw here: aliases, the knob allowlist and capability rules belong to the planner.
A config cannot carry execution mode, plan-only, expected outcomes, any authorization
(``allow_*``/``authorize_*`` keys) or a threshold; those belong to the command line (execution
policy) or the numerical contract. Hostile text never escapes as a traceback: integers beyond 64
bits, lone surrogates and nesting deeper than ``MAX_NESTING`` are JSON faults with their path;
odd keys appear in paths as ``["..."]`` and every message renders as one line; and whatever
execution would refuse (``config.limits``) is refused here, at its path, the checkpoint against
the built-in checkpoints the caller hands in (the registered runtimes' declarations). A config
and its prompt file are read only as regular files within a size limit (``read_input_text``),
checked before a byte is read, so a FIFO, a device or a huge sparse file is one error, never a
hang or a whole-file read. A prompt file may carry the ``source`` record ``logprob-drift
prompts`` writes (``config.prompt_source``); it is checked against the identity here (its
``add_special_tokens``, and a local checkpoint directory's tokenizer files). Knows nothing
about torch or any runtime.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path

from pytest_logprob_drift.config import limits
from pytest_logprob_drift.config.input_file import InputFileError, read_input
from pytest_logprob_drift.diagnostics import registry
from pytest_logprob_drift.errors import ConfigError, ConfigErrors, json_member
from pytest_logprob_drift.records import (
    CONFIG_SCHEMA_VERSION,
    BackendSelection,
    CheckpointIdentity,
    ExperimentConfig,
    Intervention,
    JsonValue,
    MaskPolicy,
    OperatorSelection,
    PackingPolicy,
    PositionPolicy,
    PromptSet,
    SamplingSpec,
    Scenario,
    ScenarioLevel,
    ScoringIdentity,
    Strategy,
    TokenizerIdentity,
    frozen_mapping,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import Any, TypedDict, TypeVar

    from pytest_logprob_drift.config import prompt_source
    from pytest_logprob_drift.records import BuiltinCheckpoint

    E = TypeVar("E", bound=enum.Enum)

    class _Truncation(TypedDict):
        """``SamplingSpec``'s truncation fields as ``_truncation`` reads them."""

        top_p: float | None
        top_k: int | None
        min_p: float | None


# Keys that would let a config decide how it is executed or judged. Refused anywhere.
_EXPECTED = "expected outcomes belong to the CLI or the plugin's options (SELECTOR=OUTCOME)"
FORBIDDEN_KEYS: Mapping[str, str] = {
    "mode": "execution mode belongs to the CLI (plan/run), not the config",
    "execution_mode": "execution mode belongs to the CLI (plan/run), not the config",
    "plan_only": "plan-only execution belongs to the CLI (the `plan` command) or the plugin's "
    "options",
    "expected": _EXPECTED,
    "expect": _EXPECTED,
    "expected_outcome": _EXPECTED,
    "expected_outcomes": _EXPECTED,
    "threshold": "the threshold is fixed by the numerical contract "
    "(contract_source/contract_version), not a config field",
    "fixed_threshold": "the threshold is fixed by the numerical contract "
    "(contract_source/contract_version), not a config field",
}

AUTHORIZATION_PREFIXES = ("allow_", "authorize_")
AUTHORIZATION_REASON = (
    "authorization is execution policy: it belongs to the CLI (a flag of "
    "`run` or the pytest plugin), not the config"
)


def forbidden_reason(key: str) -> str | None:
    """Why ``key`` may not appear anywhere in a config, or None if it may."""
    if key in FORBIDDEN_KEYS:
        return FORBIDDEN_KEYS[key]
    if key.startswith(AUTHORIZATION_PREFIXES):
        return AUTHORIZATION_REASON
    return None


TOP_LEVEL_KEYS = (
    "schema_version",
    "experiment_id",
    "scenario_id",
    "contract_source",
    "contract_version",
    "strategy",
    "strict_fallback",
    "identity",
    "baseline",
    "interventions",
    "pairs",
    "operators",
    "scenario",
    "description",
    "diagnostics",
)
REQUIRED_TOP_LEVEL = (
    "schema_version",
    "experiment_id",
    "scenario_id",
    "contract_source",
    "contract_version",
    "strategy",
    "identity",
    "baseline",
    "scenario",
)
BASELINE_SECTIONS = ("batch", "rollout", "training", "logp")
KNOWN_OPERATIONS = ("selected_logprob",)


class _Collector:
    """Gathers every fault of one document so the user sees them all at once; the
    ``ConfigFields`` a diagnostic's ``ConfigKey.parse`` reads its value with."""

    def __init__(self, source: str | None) -> None:
        self.source = source
        self.errors: list[ConfigError] = []

    def fail(self, path: str, message: str) -> None:
        self.errors.append(ConfigError(path, message, source=self.source))

    def expected(self, path: str, what: str, value: object) -> None:
        """Report ``expected <what>, got <type> <value, shortened>`` at ``path``."""
        self.fail(path, f"expected {what}, got {_type_name(value)} {_shown(value)}")

    def type_name(self, value: object) -> str:
        """The JSON type's name of ``value``, for a message."""
        return _type_name(value)

    def members(
        self, value: object, path: str, allowed: tuple[str, ...]
    ) -> dict[str, JsonValue] | None:
        """``value`` when it is an object with only ``allowed`` keys (``_object``)."""
        return _object(self, value, path, allowed)

    def typed(
        self,
        obj: Mapping[str, JsonValue],
        key: str,
        path: str,
        check: Callable[[object], bool],
        expected: str,
        default: object,
    ) -> object:
        """``obj[key]`` checked (``_typed``); a ``ConfigFields`` for ``ConfigKey.parse``."""
        value: object = _typed(self, obj, key, path, check, expected, default)
        return value

    def raise_if_any(self) -> None:
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise ConfigErrors(self.errors)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _object(
    c: _Collector, value: Any, path: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()
) -> dict[str, JsonValue] | None:
    if not isinstance(value, dict):
        c.fail(path, f"expected an object, got {_type_name(value)}")
        return None
    for key in value:
        if forbidden_reason(key) is not None:
            continue  # reported by the forbidden-key scan with its own message
        if key not in allowed:
            c.fail(json_member(path, key), f"unknown key; expected one of: {', '.join(allowed)}")
    for key in required:
        if key not in value:
            c.fail(f"{path}.{key}", "missing required key")
    return value


def _typed(
    c: _Collector,
    obj: Mapping[str, JsonValue],
    key: str,
    path: str,
    check: Callable[[Any], bool],
    expected: str,
    default: Any = ...,
) -> Any:
    if key not in obj:
        if default is ...:
            return None  # missing-required already reported by _object
        return default
    value = obj[key]
    if not check(value):
        c.fail(f"{path}.{key}", f"expected {expected}, got {_type_name(value)} {_shown(value)}")
        return None
    return value


def _shown(value: Any, limit: int = 80) -> str:
    """``repr(value)``, shortened: a message names a value, it does not reproduce it."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _is_str(v: Any) -> bool:
    return isinstance(v, str) and v != ""


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_nonneg_int(v: Any) -> bool:
    return _is_int(v) and v >= 0


def _is_pos_int(v: Any) -> bool:
    return _is_int(v) and v > 0


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _enum(
    c: _Collector,
    obj: Mapping[str, JsonValue],
    key: str,
    path: str,
    enum_type: type[E],
    default: E | None = None,
) -> E | None:
    choices = [m.value for m in enum_type]
    raw = _typed(
        c,
        obj,
        key,
        path,
        _is_str,
        "one of " + ", ".join(map(repr, choices)),
        default=None if default is None else default.value,
    )
    if raw is None:
        return default
    if raw not in choices:
        c.fail(
            f"{path}.{key}", f"expected one of {', '.join(map(repr, choices))}, got {_shown(raw)}"
        )
        return default
    return enum_type(raw)


def _scan_forbidden(c: _Collector, value: Any, path: str) -> None:
    stack = [(value, path)]  # depth-first, in document order; iterative (no recursion limit)
    while stack:
        node, where = stack.pop()
        if isinstance(node, dict):
            for key in node:
                reason = forbidden_reason(key)
                if reason is not None:
                    c.fail(json_member(where, key), f"not allowed in a config: {reason}")
            stack.extend((child, json_member(where, key)) for key, child in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((node[i], f"{where}[{i}]") for i in reversed(range(len(node))))


class _Rejected:
    """Stands in for a duplicate key's value or a NaN/Infinity so its JSON path can be named."""

    def __init__(self, message: str) -> None:
        self.message = message


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        result[key] = _Rejected(f"duplicate key {_shown(key)}") if key in result else value
    return result


def _reject_constant(name: str) -> Any:
    return _Rejected(f"{name} is not valid JSON")


MAX_NESTING = 64
"""Deepest nesting of arrays and objects a config may have (the schema needs 6)."""
MAX_INT_DIGITS = 20
"""Longest integer literal (digits) a config may hold: every integer the schema accepts fits
64 bits, and Python refuses to convert literals of more than 4,300 digits."""


def _parse_int(literal: str) -> Any:
    if len(literal) < 19:  # at most 18 digits: within 64 bits (the common case, kept cheap)
        return int(literal)
    digits = len(literal.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        return _Rejected(f"an integer literal of {digits} digits is out of range (at most 2**64)")
    value = int(literal)
    if not -limits.MAX_JSON_INT <= value <= limits.MAX_JSON_INT:
        return _Rejected(f"integer {value} is out of range (at most 2**64)")
    return value


def _lone_surrogate(text: str) -> str | None:
    """The first lone surrogate escape in ``text`` (not Unicode: cannot be hashed or written)."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return text[exc.start]
    return None


_PLAIN = (int, float, type(None))
"""JSON values json.loads never lets a fault through in (booleans are ints)."""


def _first_rejected(document: Any, root: str) -> tuple[str, str] | None:
    """The first fault json.loads lets through, in document order: a duplicate key, NaN or
    Infinity, an out-of-range integer, a lone surrogate (in a key or a string), nesting deeper
    than MAX_NESTING. Iterative, so no document can exhaust the recursion limit; numbers are
    skipped where they stand and a member's path is built only when it is visited, so a prompt
    file of millions of token ids costs one pass over them, not a path string each."""
    stack: list[tuple[Any, str, str | int | None, int]] = [(document, root, None, 0)]
    while stack:
        value, parent, member, depth = stack.pop()
        if member is None:
            path = parent
        elif isinstance(member, int):
            path = f"{parent}[{member}]"
        else:
            path = json_member(parent, member)
        if isinstance(value, _Rejected):
            return path, value.message
        if isinstance(value, str):
            bad = _lone_surrogate(value)
            if bad is not None:
                return path, f"string holds the lone surrogate \\u{ord(bad):04x} (not Unicode)"
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth >= MAX_NESTING:
            return path, f"nested deeper than {MAX_NESTING} levels"
        if isinstance(value, dict):
            for key in value:
                bad = _lone_surrogate(key)
                if bad is not None:
                    return json_member(path, key), (
                        f"key holds the lone surrogate \\u{ord(bad):04x} (not Unicode)"
                    )
            stack.extend(
                (child, path, key, depth + 1)
                for key, child in reversed(value.items())
                if not isinstance(child, _PLAIN)
            )
        else:
            stack.extend(
                (value[i], path, i, depth + 1)
                for i in reversed(range(len(value)))
                if not isinstance(value[i], _PLAIN)
            )
    return None


def parse_json_text(text: str, source: str) -> Any:
    """Strict JSON: no duplicate keys, no NaN/Infinity, integers within 64 bits, Unicode
    strings only, at most MAX_NESTING levels; errors name the JSON path."""
    try:
        document = json.loads(
            text,
            object_pairs_hook=_reject_duplicate_keys,
            parse_constant=_reject_constant,
            parse_int=_parse_int,
        )
    except json.JSONDecodeError as exc:
        raise ConfigError(
            "$", f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}", source=source
        ) from None
    except RecursionError:
        raise ConfigError(
            "$", f"invalid JSON: nested deeper than {MAX_NESTING} levels", source=source
        ) from None
    found = _first_rejected(document, "$")
    if found is not None:
        raise ConfigError(found[0], f"invalid JSON: {found[1]}", source=source)
    return document


CONFIG_FILE_LIMIT = 16 * 2**20
"""Largest config file read, in bytes (16 MiB): the schema's configs are a few KiB, and a large
prompt set belongs in ``identity.prompts.file``."""
PROMPT_FILE_LIMIT = 64 * 2**20
"""Largest prompt file read, in bytes (64 MiB: ten million token ids of six digits; the worst
case, 33 million one-digit ids, plans in 15 s with a 0.6 GiB peak on a 2-core machine)."""


def read_input_text(file: Path, limit: int) -> str:
    """The UTF-8 text of the regular file ``file``, at most ``limit`` bytes long, read as
    ``config.input_file`` reads every input (``InputFileError`` when it is not read)."""
    data = read_input(file, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"not UTF-8: {exc}") from None


def load_config(
    path: str | Path, *, checkpoints: Mapping[str, BuiltinCheckpoint]
) -> ExperimentConfig:
    """Read (a regular file of at most ``CONFIG_FILE_LIMIT`` bytes) and strictly validate a
    config file; ``checkpoints``: the built-in checkpoints a ``name://`` URI may name, by URI
    (``RuntimeCatalog.checkpoints``)."""
    file = Path(path)
    try:
        text = read_input_text(file, CONFIG_FILE_LIMIT)
    except FileNotFoundError:
        raise ConfigError("$", "config file not found", source=str(file)) from None
    except (OSError, ValueError) as exc:  # ValueError: InputFileError, or a NUL in the path
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigError("$", f"cannot read config file: {why}", source=str(file)) from None
    return parse_config(
        parse_json_text(text, str(file)),
        source=str(file),
        base_dir=file.parent,
        checkpoints=checkpoints,
    )


def parse_config(
    document: Any,
    *,
    source: str | None = None,
    base_dir: Path | None = None,
    checkpoints: Mapping[str, BuiltinCheckpoint],
) -> ExperimentConfig:
    """Validate an already-parsed JSON document; report every fault at once (``checkpoints``
    as for ``load_config``)."""
    c = _Collector(source)
    top = _object(c, document, "$", TOP_LEVEL_KEYS, REQUIRED_TOP_LEVEL)
    if top is None:
        c.raise_if_any()
        raise AssertionError("unreachable")
    _scan_forbidden(c, top, "$")

    schema_version = _typed(c, top, "schema_version", "$", _is_str, "a string")
    if schema_version is not None and schema_version != CONFIG_SCHEMA_VERSION:
        c.fail(
            "$.schema_version",
            f"unknown schema_version {_shown(schema_version)}; expected {CONFIG_SCHEMA_VERSION!r}",
        )
    experiment_id = _typed(
        c,
        top,
        "experiment_id",
        "$",
        _is_safe_id,
        "a non-empty id of letters, digits, '.', '_' or '-'",
    )
    scenario_id = _typed(c, top, "scenario_id", "$", _is_str, "a non-empty string")
    contract_source = _typed(c, top, "contract_source", "$", _is_str, "a non-empty string")
    contract_version = _typed(c, top, "contract_version", "$", _is_str, "a non-empty string")
    _typed(c, top, "description", "$", lambda v: isinstance(v, str), "a string", default="")
    strategy = _enum(c, top, "strategy", "$", Strategy)
    strict_fallback = _typed(c, top, "strict_fallback", "$", _is_bool, "a boolean", default=True)

    identity = (
        _identity(c, top.get("identity"), "$.identity", base_dir) if "identity" in top else None
    )
    baseline, baseline_paths = (
        _baseline(c, top.get("baseline"), "$.baseline") if "baseline" in top else ({}, {})
    )
    interventions = _interventions(c, top.get("interventions", []), "$.interventions")
    pairs = _pairs(c, top.get("pairs", []), "$.pairs")
    operators = _operators(c, top.get("operators", {}), "$.operators")
    diagnostics = (
        _diagnostics(c, top["diagnostics"], "$.diagnostics") if "diagnostics" in top else {}
    )
    scenario = _scenario(c, top.get("scenario"), "$.scenario") if "scenario" in top else None
    if strategy is Strategy.PAIRWISE and not pairs and "pairs" not in top:
        c.fail("$.pairs", "strategy 'pairwise' needs an explicit list of path pairs")
    if experiment_id is not None:
        fault = limits.experiment_id_fault(experiment_id)
        if fault is not None:
            c.fail("$.experiment_id", fault)
    if identity is not None:
        _execution_limits(c, identity, checkpoints)

    c.raise_if_any()
    assert identity is not None and scenario is not None and strategy is not None
    return ExperimentConfig(
        schema_version=schema_version,
        experiment_id=experiment_id,
        scenario_id=scenario_id,
        contract_source=contract_source,
        contract_version=contract_version,
        strategy=strategy,
        strict_fallback=strict_fallback,
        identity=identity,
        baseline=frozen_mapping(baseline),
        baseline_json_paths=frozen_mapping(baseline_paths),
        interventions=interventions,
        pairs=pairs,
        operators=operators,
        diagnostics=frozen_mapping(diagnostics),
        scenario=scenario,
        source=source,
    )


def _execution_limits(
    c: _Collector, identity: ScoringIdentity, checkpoints: Mapping[str, BuiltinCheckpoint]
) -> None:
    """Refuse what execution would refuse (config.limits), at the JSON path that causes it."""
    path = "$.identity"
    prompts = identity.prompts
    rows = prompts.token_ids
    uri = identity.checkpoint.uri
    fault = limits.seed_fault(identity.sampling.seed, len(rows), checkpoints.get(uri))
    if fault is not None:
        c.fail(f"{path}.sampling.seed", fault)
    known, fault = limits.checkpoint_limits(uri, checkpoints)
    if fault is not None:
        c.fail(f"{path}.checkpoint.uri", fault)
    found = limits.token_fault(rows, uri, known.vocab_size)
    if found is not None:
        where = (
            f"{path}.prompts.token_ids"
            if prompts.source is None
            else f"{path}.prompts.file<{Path(prompts.source).name}>"
        )
        c.fail(f"{where}{found[0]}", found[1])
    fault = limits.context_fault(rows, identity.sampling.max_new_tokens, uri, known.max_positions)
    if fault is not None:
        c.fail(f"{path}.sampling.max_new_tokens", fault)


def _is_safe_id(v: Any) -> bool:
    return _is_str(v) and all(ch.isalnum() or ch in "._-" for ch in v) and v[0] not in ".-"


def _identity(
    c: _Collector, value: Any, path: str, base_dir: Path | None
) -> ScoringIdentity | None:
    obj = _object(
        c,
        value,
        path,
        (
            "checkpoint",
            "tokenizer",
            "prompts",
            "sampling",
            "mask_policy",
            "training_kv_cache",
            "packing",
            "positions",
        ),
        ("checkpoint", "tokenizer", "prompts", "sampling"),
    )
    if obj is None:
        return None
    checkpoint = (
        _checkpoint(c, obj.get("checkpoint"), f"{path}.checkpoint") if "checkpoint" in obj else None
    )
    tokenizer = (
        _tokenizer(c, obj.get("tokenizer"), f"{path}.tokenizer") if "tokenizer" in obj else None
    )
    prompts, source = (
        _prompts(c, obj.get("prompts"), f"{path}.prompts", base_dir)
        if "prompts" in obj
        else (None, None)
    )
    if source is not None and checkpoint and tokenizer and prompts and prompts.source:
        where = f"{path}.prompts.file<{Path(prompts.source).name}>.source"
        _source_checks(c, source, checkpoint, tokenizer, where)
    sampling = _sampling(c, obj.get("sampling"), f"{path}.sampling") if "sampling" in obj else None
    mask_policy = _enum(c, obj, "mask_policy", path, MaskPolicy, MaskPolicy.RESPONSE_THROUGH_EOS)
    kv_cache = _typed(c, obj, "training_kv_cache", path, _is_bool, "a boolean", default=False)
    packing = _enum(c, obj, "packing", path, PackingPolicy, PackingPolicy.PADDED)
    positions = _enum(c, obj, "positions", path, PositionPolicy, PositionPolicy.FROM_ATTENTION_MASK)
    if None in (
        checkpoint,
        tokenizer,
        prompts,
        sampling,
        mask_policy,
        kv_cache,
        packing,
        positions,
    ):
        return None
    assert checkpoint and tokenizer and prompts and sampling and mask_policy and packing
    assert positions is not None and kv_cache is not None
    return ScoringIdentity(
        checkpoint=checkpoint,
        tokenizer=tokenizer,
        prompts=prompts,
        sampling=sampling,
        mask_policy=mask_policy,
        training_kv_cache=kv_cache,
        packing=packing,
        positions=positions,
    )


def _checkpoint(c: _Collector, value: Any, path: str) -> CheckpointIdentity | None:
    obj = _object(c, value, path, ("uri", "model_version", "digest"), ("uri", "model_version"))
    if obj is None:
        return None
    uri = _typed(
        c,
        obj,
        "uri",
        path,
        _is_str,
        "a non-empty string (a local checkpoint directory or a tiny:// URI)",
    )
    version = _typed(c, obj, "model_version", path, _is_str, "a non-empty string")
    digest = _typed(
        c, obj, "digest", path, _is_sha256, "null or a 64-hex-digit SHA-256", default=None
    )
    if (
        uri is None
        or version is None
        or ("digest" in obj and obj["digest"] is not None and digest is None)
    ):
        return None
    return CheckpointIdentity(uri=uri, model_version=version, digest=digest)


def _is_sha256(v: Any) -> bool:
    return v is None or (
        isinstance(v, str) and len(v) == 64 and all(ch in "0123456789abcdef" for ch in v)
    )


def _tokenizer(c: _Collector, value: Any, path: str) -> TokenizerIdentity | None:
    obj = _object(c, value, path, ("id", "add_special_tokens", "chat_template"), ("id",))
    if obj is None:
        return None
    tok_id = _typed(c, obj, "id", path, _is_str, "a non-empty string")
    special = _typed(c, obj, "add_special_tokens", path, _is_bool, "a boolean", default=False)
    template = _typed(
        c,
        obj,
        "chat_template",
        path,
        lambda v: v is None or isinstance(v, str),
        "null or a string",
        default=None,
    )
    if tok_id is None or special is None:
        return None
    return TokenizerIdentity(
        tokenizer_id=tok_id, add_special_tokens=special, chat_template=template
    )


def _token_rows(c: _Collector, value: Any, path: str) -> tuple[tuple[int, ...], ...] | None:
    if not isinstance(value, list) or not value:
        c.fail(path, f"expected a non-empty array of token-id arrays, got {_type_name(value)}")
        return None
    rows: list[tuple[int, ...]] = []
    ok = True
    for i, row in enumerate(value):
        if not isinstance(row, list) or not row:
            c.fail(
                f"{path}[{i}]", f"expected a non-empty array of token ids, got {_type_name(row)}"
            )
            ok = False
            continue
        if all(type(tok) is int and tok >= 0 for tok in row):
            rows.append(tuple(row))  # the common case, one pass (a bool's type is not int)
            continue
        for j, tok in enumerate(row):
            if not _is_nonneg_int(tok):
                c.fail(
                    f"{path}[{i}][{j}]",
                    f"expected a non-negative integer token id, got {_type_name(tok)} "
                    f"{_shown(tok)}",
                )
                ok = False
        rows.append(tuple(row))
    return tuple(rows) if ok else None


def _prompts(
    c: _Collector, value: Any, path: str, base_dir: Path | None
) -> tuple[
    PromptSet | None, prompt_source.PromptSource | prompt_source.ImportedPromptSource | None
]:
    """The prompt set, and the ``source`` record of a prompt file ``logprob-drift prompts``
    wrote (None for inline token ids and for a file of token ids alone)."""
    obj = _object(c, value, path, ("token_ids", "file"))
    if obj is None:
        return None, None
    if ("token_ids" in obj) == ("file" in obj):
        c.fail(path, "expected exactly one of 'token_ids' (inline) or 'file'")
        return None, None
    if "token_ids" in obj:
        rows = _token_rows(c, obj["token_ids"], f"{path}.token_ids")
        return (PromptSet(token_ids=rows) if rows is not None else None), None
    name = _typed(c, obj, "file", path, _is_str, "a non-empty file path")
    if name is None:
        return None, None
    file = Path(name) if base_dir is None or Path(name).is_absolute() else base_dir / name
    try:
        text = read_input_text(file, PROMPT_FILE_LIMIT)
    except OSError as exc:
        c.fail(f"{path}.file", f"cannot read prompt file {str(file)!r}: {exc.strerror}")
        return None, None
    except ValueError as exc:  # InputFileError, or a NUL in the path
        c.fail(f"{path}.file", f"cannot read prompt file {str(file)!r}: {exc}")
        return None, None
    try:
        data = parse_json_text(text, str(file))
    except ConfigError as exc:
        c.fail(f"{path}.file", f"prompt file {str(file)!r}: {exc.message}")
        return None, None
    raw_source = None
    if isinstance(data, dict) and set(data) in ({"token_ids"}, {"token_ids", "source"}):
        raw_source = data.get("source")
        data = data["token_ids"]
    rows = _token_rows(c, data, f"{path}.file<{file.name}>")
    if rows is None:
        return None, None
    source = None
    if raw_source is not None:
        from pytest_logprob_drift.config import prompt_source  # only for a file with a source

        try:
            source = prompt_source.parse_source(raw_source, len(rows))
        except prompt_source.SourceShapeError as exc:
            c.fail(f"{path}.file<{file.name}>.{exc.path}", exc.message)
            return None, None
    return PromptSet(token_ids=rows, source=str(file)), source


def _source_checks(
    c: _Collector,
    source: prompt_source.PromptSource | prompt_source.ImportedPromptSource,
    checkpoint: CheckpointIdentity,
    tokenizer: TokenizerIdentity,
    path: str,
) -> None:
    """A prompt file's ``source`` against the identity: the same ``add_special_tokens`` (for
    prompts tokenized here; prompts taken from an imported run were tokenized as logged), and,
    for a local checkpoint directory, the same tokenizer files (``config.prompt_source``)."""
    if (
        source.add_special_tokens is not None
        and source.add_special_tokens != tokenizer.add_special_tokens
    ):
        c.fail(
            f"{path}.add_special_tokens",
            f"the prompts were tokenized with add_special_tokens="
            f"{str(source.add_special_tokens).lower()}, the identity's tokenizer says "
            f"{str(tokenizer.add_special_tokens).lower()}",
        )
    uri = checkpoint.uri
    if "://" in uri or "\0" in uri or limits.path_fault(uri) is not None:
        return  # a built-in checkpoint is built from code; a bad path is refused elsewhere
    from pytest_logprob_drift.config.prompt_source import tokenizer_fault

    fault = tokenizer_fault(source, Path(uri))
    if fault is not None:
        c.fail(f"{path}.tokenizer_files", fault)


def _sampling(c: _Collector, value: Any, path: str) -> SamplingSpec | None:
    obj = _object(
        c,
        value,
        path,
        ("seed", "max_new_tokens", "temperature", "top_p", "top_k", "min_p"),
        ("seed", "max_new_tokens"),
    )
    if obj is None:
        return None
    truncation = _truncation(c, obj, path)
    seed = _typed(c, obj, "seed", path, _is_nonneg_int, "a non-negative integer")
    max_new = _typed(c, obj, "max_new_tokens", path, _is_pos_int, "a positive integer")
    temperature = _typed(
        c,
        obj,
        "temperature",
        path,
        lambda v: _is_number(v) and v >= 0,
        "a finite number >= 0",
        default=1.0,
    )
    if seed is None or max_new is None or temperature is None or truncation is None:
        return None
    return SamplingSpec(
        seed=seed, max_new_tokens=max_new, temperature=float(temperature), **truncation
    )


def _truncation(c: _Collector, obj: Mapping[str, JsonValue], path: str) -> _Truncation | None:
    """The optional sampling truncation; absent means the sampler does not truncate by it
    (so ``top_p`` 1 and ``min_p`` 0, which truncate nothing, are spelled by leaving them out)."""
    top_p = _typed(
        c,
        obj,
        "top_p",
        path,
        lambda v: _is_number(v) and 0 < v < 1,
        "a number in (0, 1) (leave top_p out for no nucleus truncation)",
    )
    top_k = _typed(c, obj, "top_k", path, _is_pos_int, "a positive integer")
    min_p = _typed(
        c,
        obj,
        "min_p",
        path,
        lambda v: _is_number(v) and 0 < v < 1,
        "a number in (0, 1) (leave min_p out for no min-p truncation)",
    )
    if any(
        key in obj and value is None
        for key, value in (("top_p", top_p), ("top_k", top_k), ("min_p", min_p))
    ):
        return None
    return {
        "top_p": None if top_p is None else float(top_p),
        "top_k": top_k,
        "min_p": None if min_p is None else float(min_p),
    }


def _baseline(c: _Collector, value: Any, path: str) -> tuple[dict[str, JsonValue], dict[str, str]]:
    flat: dict[str, JsonValue] = {}
    json_paths: dict[str, str] = {}
    obj = _object(c, value, path, BASELINE_SECTIONS)
    if obj is None:
        return flat, json_paths
    if not obj:
        c.fail(path, "baseline is empty; declare at least one knob value")
    for section, body in obj.items():
        if section not in BASELINE_SECTIONS:
            continue
        if not isinstance(body, dict):
            c.fail(f"{path}.{section}", f"expected an object, got {_type_name(body)}")
            continue
        for key, raw in body.items():
            if forbidden_reason(key) is not None:
                continue
            if isinstance(raw, (dict, list)) or raw is None:
                c.fail(
                    json_member(f"{path}.{section}", key),
                    f"expected a string, integer or boolean knob value, got {_type_name(raw)}",
                )
                continue
            flat[f"{section}.{key}"] = raw
            json_paths[f"{section}.{key}"] = json_member(f"{path}.{section}", key)
    return flat, json_paths


def _interventions(c: _Collector, value: Any, path: str) -> tuple[Intervention, ...]:
    if not isinstance(value, list):
        c.fail(path, f"expected an array of {{path, values}} objects, got {_type_name(value)}")
        return ()
    result: list[Intervention] = []
    for i, item in enumerate(value):
        ipath = f"{path}[{i}]"
        obj = _object(c, item, ipath, ("path", "values", "description"), ("path", "values"))
        if obj is None:
            continue
        _typed(c, obj, "description", ipath, lambda v: isinstance(v, str), "a string", default="")
        knob = _typed(c, obj, "path", ipath, _is_str, "a knob path string such as 'batch.size'")
        values = obj.get("values")
        if "values" in obj and (not isinstance(values, list) or not values):
            c.fail(f"{ipath}.values", f"expected a non-empty array, got {_type_name(values)}")
            continue
        if knob is None or not isinstance(values, list):
            continue
        for j, raw in enumerate(values):
            if isinstance(raw, (dict, list)) or raw is None:
                c.fail(
                    f"{ipath}.values[{j}]",
                    f"expected a string, integer or boolean knob value, got {_type_name(raw)}",
                )
        result.append(Intervention(path=knob, values=tuple(values), json_path=ipath))
    return tuple(result)


def _pairs(c: _Collector, value: Any, path: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list):
        c.fail(path, f"expected an array of [path, path] pairs, got {_type_name(value)}")
        return ()
    result: list[tuple[str, str]] = []
    for i, item in enumerate(value):
        if not (isinstance(item, list) and len(item) == 2 and all(_is_str(p) for p in item)):
            c.fail(f"{path}[{i}]", "expected a pair of two knob path strings")
            continue
        result.append((item[0], item[1]))
    return tuple(result)


def _backend_selection(c: _Collector, value: Any, path: str) -> BackendSelection | None:
    if isinstance(value, str) and value:
        return BackendSelection(backend=value)
    obj = _object(c, value, path, ("backend", "options"), ("backend",))
    if obj is None:
        return None
    backend = _typed(c, obj, "backend", path, _is_str, "a backend id string")
    options = _typed(
        c, obj, "options", path, lambda v: isinstance(v, dict), "an object", default={}
    )
    if backend is None or options is None:
        return None
    return BackendSelection(backend=backend, options=frozen_mapping(options))


def _operators(c: _Collector, value: Any, path: str) -> tuple[OperatorSelection, ...]:
    obj = _object(c, value, path, KNOWN_OPERATIONS)
    if obj is None:
        return ()
    result: list[OperatorSelection] = []
    for operation, body in obj.items():
        if operation not in KNOWN_OPERATIONS:
            continue
        opath = f"{path}.{operation}"
        sides = _object(c, body, opath, ("rollout", "training"), ("rollout", "training"))
        if sides is None or "rollout" not in sides or "training" not in sides:
            continue
        rollout = _backend_selection(c, sides["rollout"], f"{opath}.rollout")
        training = _backend_selection(c, sides["training"], f"{opath}.training")
        if rollout and training:
            result.append(
                OperatorSelection(operation=operation, rollout=rollout, training=training)
            )
    return tuple(result)


def _scenario(c: _Collector, value: Any, path: str) -> Scenario | None:
    obj = _object(c, value, path, ("level", "device"), ("level", "device"))
    if obj is None:
        return None
    level = _enum(c, obj, "level", path, ScenarioLevel)
    device = _typed(c, obj, "device", path, lambda v: v in ("cpu", "cuda"), "'cpu' or 'cuda'")
    if level is None or device is None:
        return None
    return Scenario(level=level, device=device)


def _diagnostics(c: _Collector, value: Any, path: str) -> dict[str, object]:
    """``{"<key>": ..., ...}``: opt-in diagnostics that never change a verdict, one member per
    installed diagnostic's config key, each read by its ``ConfigKey.parse`` (absent or false:
    none); the asked-for values by config key, in the registry's order."""
    keys = registry.config_keys()
    obj = _object(c, value, path, tuple(k.key for k in keys))
    if obj is None:
        return {}
    asked = {}
    for key in keys:
        if key.key in obj:
            parsed = key.parse(c, obj[key.key], json_member(path, key.key))
            if parsed is not None:
                asked[key.key] = parsed
    return asked
