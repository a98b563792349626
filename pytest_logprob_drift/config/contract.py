"""The repository numerical contract: the one fixed mismatch threshold.

Owns loading the versioned contract file shipped as package data and resolving
``(contract_source, contract_version)`` to a concrete version and threshold; ``"current"``
resolves to the concrete version that is then recorded and hashed (the digest covers the
source, the version and its whole entry). A threshold of 0 is allowed (the ``bitwise``
source: any difference is a mismatch); a negative, NaN or infinite one is refused. A version's
``minor_version`` (0 when absent) counts compatible clarifications of what is compared (1: the
sampling semantics of issue 13); it is recorded in every comparison and in the execution key
(through the digest), never in case ids, since the rule and the threshold do not change. The
threshold is never a config field, CLI flag or knob: nothing here accepts one. Knows nothing
about configs, planning or tensors.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from pytest_logprob_drift.errors import ConfigError
from pytest_logprob_drift.records import ResolvedContract, canonical_json, sha256_hex

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import Any

CONTRACT_FILE = "numerical_contract.json"
CONTRACT_SCHEMA_VERSION = "cross_config.numerical_contract.v1"


def _contract_text() -> str:
    """The shipped contract file: read next to this module (importlib.resources, which costs
    more to import than the rest of planning, only for a zipped install)."""
    beside = Path(__file__).with_name(CONTRACT_FILE)
    if beside.is_file():
        return beside.read_text(encoding="utf-8")
    from importlib import resources  # pragma: no cover - zipped installs

    return resources.files(__package__).joinpath(CONTRACT_FILE).read_text(encoding="utf-8")


def _load_document() -> dict[str, Any]:
    text = _contract_text()
    document: dict[str, Any] = json.loads(text)
    if document.get("schema_version") != CONTRACT_SCHEMA_VERSION:
        raise ConfigError(
            "$.schema_version",
            f"numerical contract file is not {CONTRACT_SCHEMA_VERSION}",
            source=CONTRACT_FILE,
        )
    return document


def resolve_contract(source: str, version: str) -> ResolvedContract:
    """Resolve a contract reference; errors name the config's JSON path."""
    sources = _load_document()["sources"]
    if source not in sources:
        raise ConfigError(
            "$.contract_source",
            f"unknown contract source {source!r}; known: {', '.join(sorted(sources))}",
        )
    entry = sources[source]
    concrete = entry["current"] if version == "current" else version
    versions = entry["versions"]
    if concrete not in versions:
        raise ConfigError(
            "$.contract_version",
            f"contract {source!r} has no version "
            f"{version!r}; known: current, {', '.join(sorted(versions))}",
        )
    body = versions[concrete]
    threshold = body["threshold"]
    # 0.0 is a threshold (``bitwise``: any difference is a mismatch, equality passes)
    if not isinstance(threshold, float) or not math.isfinite(threshold) or threshold < 0:
        raise ConfigError(
            f"$.sources.{source}.versions.{concrete}.threshold",
            "threshold must be a non-negative finite float",
            source=CONTRACT_FILE,
        )
    minor = body.get("minor_version", 0)
    if isinstance(minor, bool) or not isinstance(minor, int) or minor < 0:
        raise ConfigError(
            f"$.sources.{source}.versions.{concrete}.minor_version",
            "minor_version must be a non-negative integer",
            source=CONTRACT_FILE,
        )
    return ResolvedContract(
        source=source,
        version=concrete,
        threshold=threshold,
        unit=str(body["unit"]),
        digest=sha256_hex(canonical_json({"source": source, "version": concrete, **body})),
        minor_version=minor,
    )
