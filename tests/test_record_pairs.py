"""The plan's records and their sealed twins in ``comparison.json``: one converter each, every
field carried (field lists read from the types, so a field added to one side fails here).

``records.ResolvedContract`` is on ``plan``'s path (a typing-free dataclass) and
``numerics.comparison.Contract`` is sealed (a msgspec Struct), so the pair stays with one
converter, ``Contract.of``. What a runtime did with a knob has one type, ``KnobRecord``, built
by ``execute.protocol.application_records`` and sealed as built.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import msgspec

from pytest_logprob_drift import records
from pytest_logprob_drift.execute.protocol import Materialized, application_records
from pytest_logprob_drift.numerics.comparison import Contract, KnobRecord
from pytest_logprob_drift.records import (
    ApplicationStatus,
    Lifecycle,
    ResolvedContract,
    canonical,
)
from pytest_logprob_drift.store.decode import decode


def _distinct_values(kind: type) -> dict[str, Any]:
    """A value per dataclass field of ``kind``, none equal to its default nor to another's."""
    values: dict[str, Any] = {}
    for index, f in enumerate(dataclasses.fields(kind)):
        if f.type in ("str", str):
            values[f.name] = f"value-of-{f.name}"
        elif f.type in ("int", int):
            values[f.name] = 100 + index
        elif f.type in ("float", float):
            values[f.name] = 0.5 + index
        else:  # a field of another type: this test must learn it
            raise AssertionError(f"{kind.__name__}.{f.name}: no value for type {f.type!r}")
    return values


def test_a_resolved_contract_is_sealed_and_read_back_field_for_field() -> None:
    fields = _distinct_values(ResolvedContract)
    assert tuple(fields) == Contract.__struct_fields__  # same members, same order
    resolved = ResolvedContract(**fields)
    sealed = Contract.of(resolved)
    for name, value in fields.items():
        assert getattr(sealed, name) == value, name
    data = json.dumps(sealed.to_json()).encode()
    assert json.loads(data) == canonical(resolved)  # the plan's form of it, member for member
    read = decode(data, Contract)
    assert read == sealed
    assert ResolvedContract(**msgspec.structs.asdict(read)) == resolved


def test_a_knob_record_is_built_once_and_sealed_as_built() -> None:
    assert not hasattr(records, "KnobApplication")  # one type, no converter
    built = application_records(
        {"rollout.dtype": "bfloat16", "batch.size": 4},
        {
            "rollout.dtype": Materialized(
                value="bfloat16", status=ApplicationStatus.APPLIED, evidence="model_config.dtype"
            )
        },
        {"rollout.dtype": "float16"},
    )
    assert all(type(record) is KnobRecord for record in built)
    by_knob = {record.knob: record for record in built}
    dtype, batch = by_knob["rollout.dtype"], by_knob["batch.size"]
    assert (dtype.lifecycle, dtype.status) == (
        Lifecycle.ENGINE_CONSTRUCTION,
        ApplicationStatus.ERROR,
    )
    assert "silent fallback: engine reports 'float16'" in dtype.evidence
    assert (batch.materialized, batch.status) == (None, ApplicationStatus.UNSUPPORTED)
    for record in built:
        data = json.dumps(record.to_json()).encode()
        assert set(json.loads(data)) == set(KnobRecord.__struct_fields__)
        assert decode(data, KnobRecord) == record
