"""The one seal mechanism (``store.seal``) for every kind of seal: attempts' and attributions'
COMPLETE and the run seals of experiment.json/plan.jsonl.

Each kind round-trips (unkeyed and keyed), re-serializes byte for byte as the runs sealed before
the mechanism existed, and refuses every damaged or hostile form with a SealError naming the
file: a flipped byte, an extra or a missing file, a non-plain name, a wrong MAC, a MAC under
another key, a non-ASCII MAC, a manifest of the wrong JSON type. The verifier reads each file
once and hands back the very bytes it hashed, and the readers parse those bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from drift_testing import experiment_document, plan_row

from pytest_logprob_drift.attribution.document import document_json, read_attribution_bytes
from pytest_logprob_drift.attribution.sealed import (
    ATTRIBUTION_SEAL,
    attribution_document,
    open_attribution,
    read_attribution,
    write_attribution,
)
from pytest_logprob_drift.check.resume import load_sealed_document
from pytest_logprob_drift.check.verify import verify_run_files
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.attempt import ATTEMPT_SEAL, AttemptWriter, read_seal
from pytest_logprob_drift.store.files import json_bytes
from pytest_logprob_drift.store.keys import SealKey, load_seal_key, sealing_with
from pytest_logprob_drift.store.run import RUN_SEAL, ArtifactStore, read_run_seal, run_seals
from pytest_logprob_drift.store.seal import SealError, SealForm, read_manifest

KEY = SealKey(b"k" * 32, "the test key")
OTHER_KEY = SealKey(b"o" * 32, "another test key")
CASE = "case-1"
PAYLOADS = {"a.json": b'{"x": 1}\n', "b.pt": bytes(range(256)) * 4}
FIXTURE = Path(__file__).parent / "data" / "pre_issue20"


def sealed_attempt(root: Path, key: SealKey | None = None) -> Path:
    """An attempt of two payloads sealed through AttemptWriter."""
    with sealing_with(key):
        writer = AttemptWriter(root / layout.CASES / CASE, CASE, "e" * 64)
        for name, data in PAYLOADS.items():
            writer.write_bytes(name, data)
        writer.seal()
    return writer.directory


ATTRIBUTION = {
    "schema_version": "cross_config.attribution.v1",
    "inputs": [{"case_id": CASE, "attempt_id": "a-1", "complete_sha256": "0" * 64}],
    "experiment_id": "x",
    "baseline": {"case_id": CASE, "attempt_id": "a-1"},
    "noise_floor": {
        "measured": False,
        "repeats": 0,
        "rollout_max_abs_delta": 0.0,
        "training_max_abs_delta": 0.0,
    },
    "cases": [],
    "ranking": [],
    "skipped": [],
}
"""The smallest document of the shape ``attribution.sealed`` reads (no case attributed)."""


def sealed_attribution(root: Path, key: SealKey | None = None) -> Path:
    with sealing_with(key):
        return write_attribution(root, ATTRIBUTION).directory


# name: (make a sealed directory, read it back, the file it seals)
KINDS: dict[str, tuple[Callable[..., Path], Callable[[Path], Any], str]] = {
    "attempt": (sealed_attempt, read_seal, "a.json"),
    "attribution": (sealed_attribution, read_attribution, layout.ATTRIBUTION),
}


@pytest.fixture(params=sorted(KINDS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def rewrite(path: Path, change: Callable[[dict[str, Any]], Any], key: SealKey | None) -> None:
    """Rewrite a manifest through ``change`` (its MAC recomputed under ``key``, dropped
    without one): what anyone who can write the directory can do."""
    document = json.loads(path.read_bytes())
    document.pop("mac", None)
    document = change(document) or document
    if key is not None:
        document["mac"] = key.mac(document)
    os.chmod(path, 0o644)
    path.write_bytes(json_bytes(document))


def refused(read: Callable[[Path], Any], directory: Path, key: SealKey | None = None) -> SealError:
    with sealing_with(key), pytest.raises(SealError) as caught:
        read(directory)
    return caught.value


# --------------------------------------------------------------------------- round trips


def test_an_attempt_round_trips(tmp_path: Path) -> None:
    attempt = sealed_attempt(tmp_path)
    seal = read_seal(attempt, keep=("a.json",))
    assert (seal.case_id, seal.attempt_id, seal.execution_key) == (CASE, attempt.name, "e" * 64)
    assert seal.files == {n: hashlib.sha256(d).hexdigest() for n, d in PAYLOADS.items()}
    assert seal.mac is None
    assert dict(seal.contents) == {"a.json": PAYLOADS["a.json"]}
    assert (
        seal.manifest.sha256 == hashlib.sha256((attempt / layout.COMPLETE).read_bytes()).hexdigest()
    )


def test_an_attribution_round_trips(tmp_path: Path) -> None:
    directory = sealed_attribution(tmp_path)
    assert document_json(read_attribution(directory)) == ATTRIBUTION
    sealed = open_attribution(directory)
    assert sealed.manifest.header == {
        "attribution_id": directory.name,
        "inputs": ATTRIBUTION["inputs"],
    }
    assert set(sealed.files) == {layout.ATTRIBUTION}


def test_sealed_attribution_bytes_are_the_writers_and_decode_to_one_record(tmp_path: Path) -> None:
    """The typed record encodes back to the very bytes it was decoded from, and the writer
    seals the same bytes as before it (pre_issue20's documents, written before the type)."""
    for path in sorted(FIXTURE.glob("runs/*/attributions/*/attribution.json")):
        data = path.read_bytes()
        record = read_attribution_bytes(data)
        assert json_bytes(document_json(record)) == data
        run_dir = tmp_path / path.parent.parent.parent.name
        run_dir.mkdir()
        sealed = write_attribution(run_dir, json.loads(data))
        assert (sealed.directory / layout.ATTRIBUTION).read_bytes() == data
        assert sealed.document == record and not sealed.reused


def test_a_run_seal_round_trips(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path, "exp")
    store.initialize(experiment_document("exp"), [plan_row("c1"), plan_row("c2")])
    [(length, path)] = run_seals(store.directory)
    manifest = read_run_seal(path)
    plan = (store.directory / layout.PLAN).read_bytes()
    assert manifest.files[layout.PLAN].length == length == len(plan)
    assert manifest.files[layout.PLAN].matches(plan)
    assert manifest.files[layout.EXPERIMENT].matches(
        (store.directory / layout.EXPERIMENT).read_bytes()
    )
    assert {s.status for s in verify_run_files(store.directory)} == {"ok"}


def test_each_kind_round_trips_under_a_key_and_only_under_it(tmp_path: Path, kind: str) -> None:
    make, read, _ = KINDS[kind]
    directory = make(tmp_path, KEY)
    with sealing_with(KEY):
        read(directory)
    assert "mac" in json.loads((directory / layout.COMPLETE).read_bytes())
    with sealing_with(None):
        read(directory)  # a keyed seal is still a plain SHA-256 manifest
    error = refused(read, directory, OTHER_KEY)
    assert error.file == layout.COMPLETE and error.message.startswith("sealed with another key")


def test_a_keyed_run_seal_verifies_under_its_key_only(tmp_path: Path) -> None:
    with sealing_with(KEY):
        store = ArtifactStore(tmp_path, "exp")
        store.initialize(experiment_document("exp"), [plan_row("c1")])
        assert {s.status for s in verify_run_files(store.directory)} == {"ok"}
    with sealing_with(OTHER_KEY):
        statuses = {s.file: s for s in verify_run_files(store.directory)}
    [seal] = [s for name, s in statuses.items() if name.startswith(layout.SEALS)]
    assert seal.status == "invalid" and seal.detail.startswith("sealed with another key")


# --------------------------------------------------------------------------- byte-for-byte


def _fixture_manifests() -> list[tuple[Path, SealForm]]:
    runs = FIXTURE / "runs"
    found = [
        (p, ATTEMPT_SEAL) for p in sorted(runs.glob(f"*/{layout.CASES}/*/*/{layout.COMPLETE}"))
    ]
    found += [
        (p, ATTRIBUTION_SEAL) for p in sorted(runs.glob(f"*/attributions/*/{layout.COMPLETE}"))
    ]
    found += [(p, RUN_SEAL) for p in sorted(runs.glob(f"*/{layout.SEALS}/*.json"))]
    return found


def test_every_seal_sealed_before_the_mechanism_parses_and_reserializes_byte_for_byte() -> None:
    manifests = _fixture_manifests()
    assert {form.what for _, form in manifests} == {"seal", "attribution seal", "run seal"}
    key = load_seal_key(file=str(FIXTURE / "key"), flags=("--key-file", "--key-env"))
    assert key is not None
    keyed = 0
    for path, form in manifests:
        manifest = read_manifest(path, form, name=path.name)
        assert json_bytes(manifest.document()) == path.read_bytes(), path
        if manifest.mac is not None:
            keyed += 1
            assert manifest.mac_problem(key) is None, path  # the MAC computation is unchanged
    assert keyed >= 5  # the hf run: its attempts, its attribution and its run seal


def test_a_new_manifest_is_the_old_format(tmp_path: Path) -> None:
    """The document an attempt seal held before the mechanism: same keys, same MAC."""
    attempt = sealed_attempt(tmp_path, KEY)
    body = {
        "case_id": CASE,
        "attempt_id": attempt.name,
        "execution_key": "e" * 64,
        "files": {n: hashlib.sha256(d).hexdigest() for n, d in sorted(PAYLOADS.items())},
    }
    expected = json_bytes({**body, "mac": KEY.mac(body)})
    assert (attempt / layout.COMPLETE).read_bytes() == expected


# --------------------------------------------------------------------------- refusals


def test_a_flipped_byte_in_a_covered_file_is_refused(tmp_path: Path, kind: str) -> None:
    make, read, name = KINDS[kind]
    directory = make(tmp_path)
    data = bytearray((directory / name).read_bytes())
    data[3] ^= 0x01
    os.chmod(directory / name, 0o644)
    (directory / name).write_bytes(bytes(data))
    error = refused(read, directory)
    assert error.file == name and "SHA-256 does not match" in error.message


def test_an_extra_file_is_refused(tmp_path: Path, kind: str) -> None:
    make, read, _ = KINDS[kind]
    directory = make(tmp_path)
    (directory / "extra.json").write_bytes(b"{}")
    error = refused(read, directory)
    assert (error.file, error.message) == ("extra.json", "file is not covered by the seal")


def test_a_missing_file_is_refused(tmp_path: Path, kind: str) -> None:
    make, read, name = KINDS[kind]
    directory = make(tmp_path)
    (directory / name).unlink()
    error = refused(read, directory)
    assert error.file == name and "missing" in error.message


def test_a_missing_manifest_is_refused(tmp_path: Path, kind: str) -> None:
    make, read, _ = KINDS[kind]
    directory = make(tmp_path)
    (directory / layout.COMPLETE).unlink()
    error = refused(read, directory)
    assert error.file == layout.COMPLETE and error.message.startswith("missing")


@pytest.mark.parametrize("entry", ["../a.json", "/etc/passwd", ".hidden", "sub/a.json", ""])
def test_a_manifest_naming_a_non_plain_name_is_refused(
    tmp_path: Path, kind: str, entry: str
) -> None:
    make, read, name = KINDS[kind]
    directory = make(tmp_path)

    def rename(document: dict[str, Any]) -> None:
        document["files"][entry] = document["files"].pop(name)

    rewrite(directory / layout.COMPLETE, rename, None)
    error = refused(read, directory)
    assert error.file == layout.COMPLETE
    assert "not a plain file name" in error.message or "must cover" in error.message


def test_the_attempt_seal_names_a_non_plain_entry_as_such(tmp_path: Path) -> None:
    attempt = sealed_attempt(tmp_path)
    rewrite(attempt / layout.COMPLETE, lambda d: d["files"].update({"../x": "0" * 64}), None)
    error = refused(read_seal, attempt)
    assert error.file == layout.COMPLETE and "'../x' is not a plain file name" in error.message


def test_a_wrong_mac_is_refused(tmp_path: Path, kind: str) -> None:
    make, read, _ = KINDS[kind]
    directory = make(tmp_path, KEY)
    document = json.loads((directory / layout.COMPLETE).read_bytes())
    document["mac"]["value"] = "0" * 64
    (directory / layout.COMPLETE).write_bytes(json_bytes(document))
    error = refused(read, directory, KEY)
    assert error.file == layout.COMPLETE and "does not verify" in error.message


def test_a_mac_under_another_key_is_refused(tmp_path: Path, kind: str) -> None:
    make, read, _ = KINDS[kind]
    directory = make(tmp_path, KEY)
    rewrite(directory / layout.COMPLETE, lambda d: None, OTHER_KEY)
    error = refused(read, directory, KEY)
    assert error.file == layout.COMPLETE and error.message.startswith("sealed with another key")


def test_a_missing_mac_is_refused_under_a_key(tmp_path: Path, kind: str) -> None:
    make, read, _ = KINDS[kind]
    directory = make(tmp_path)
    error = refused(read, directory, KEY)
    assert error.file == layout.COMPLETE and error.message.startswith("not sealed with a key")


@pytest.mark.parametrize("key", [KEY, None], ids=["keyed", "unkeyed"])
@pytest.mark.parametrize(
    ("mac", "problem"),
    [
        (
            {"algorithm": "hmac-sha256", "key_id": "0" * 16, "value": "é" * 64},
            "$.mac.value: Expected `str` matching regex '^[ -~]*$'",
        ),
        (
            {"algorithm": "hmac-sha256", "key_id": "ключ", "value": "0" * 64},
            "$.mac.key_id: Expected `str` matching regex '^[ -~]*$'",
        ),
        (
            {"algorithm": "hmac-sha256", "key_id": "0" * 16, "value": 7},
            "$.mac.value: Expected `str`, got `int`",
        ),
        (
            {"algorithm": "hmac-sha256", "value": "0" * 64},
            "$.mac: Object missing required field `key_id`",
        ),
        ("0" * 64, "$.mac: Expected `object`, got `str`"),
        (None, "$.mac: Expected `object`, got `null`"),
    ],
    ids=["non-ascii-value", "non-ascii-key-id", "number", "no-key-id", "string", "null"],
)
def test_a_malformed_mac_is_refused_not_crashed_on(
    tmp_path: Path, kind: str, mac: Any, problem: str, key: SealKey | None
) -> None:
    make, read, _ = KINDS[kind]
    directory = make(tmp_path, KEY)
    document = json.loads((directory / layout.COMPLETE).read_bytes())
    document["mac"] = mac
    (directory / layout.COMPLETE).write_bytes(json_bytes(document))
    error = refused(read, directory, key)
    what = "attribution seal" if kind == "attribution" else "seal"
    assert (error.file, error.message) == (layout.COMPLETE, f"malformed {what}: {problem}")


WRONG_TYPES: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
    ("array", lambda d: [d]),
    ("string", lambda d: "COMPLETE"),
    ("null", lambda d: None),
    ("files-array", lambda d: {**d, "files": list(d["files"])}),
    ("digest-number", lambda d: {**d, "files": dict.fromkeys(d["files"], 7)}),
    ("digest-short", lambda d: {**d, "files": dict.fromkeys(d["files"], "abc")}),
    ("header-number", lambda d: {**d, next(iter(d)): 1}),
    ("extra-key", lambda d: {**d, "extra": 1}),
    ("missing-key", lambda d: {k: v for k, v in d.items() if k != "files"}),
]


@pytest.mark.parametrize("change", [c for _, c in WRONG_TYPES], ids=[n for n, _ in WRONG_TYPES])
def test_a_manifest_of_the_wrong_json_type_is_refused(
    tmp_path: Path, kind: str, change: Callable[[dict[str, Any]], Any]
) -> None:
    make, read, _ = KINDS[kind]
    directory = make(tmp_path)
    document = json.loads((directory / layout.COMPLETE).read_bytes())
    (directory / layout.COMPLETE).write_bytes(json_bytes(change(document)))
    error = refused(read, directory)
    assert error.file == layout.COMPLETE
    assert "malformed" in error.message or "has no SHA-256 digest" in error.message


@pytest.mark.parametrize(
    "data",
    [b"", b"{", b"\xff\xfe", b"[" * 100_000 + b"]" * 100_000, b'{"files": NaN}'],
    ids=["empty", "truncated", "not-utf8", "deep", "nan"],
)
def test_a_manifest_that_is_not_json_is_refused(tmp_path: Path, kind: str, data: bytes) -> None:
    make, read, _ = KINDS[kind]
    directory = make(tmp_path)
    (directory / layout.COMPLETE).write_bytes(data)
    error = refused(read, directory)
    assert error.file == layout.COMPLETE


def test_a_manifest_that_is_a_symlink_is_refused(tmp_path: Path, kind: str) -> None:
    make, read, _ = KINDS[kind]
    directory = make(tmp_path)
    real = tmp_path / "elsewhere"
    (directory / layout.COMPLETE).rename(real)
    (directory / layout.COMPLETE).symlink_to(real)
    error = refused(read, directory)
    assert error.file == layout.COMPLETE


RUN_SEAL_DAMAGE: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
    ("array", lambda d: [d]),
    ("plan-string", lambda d: {**d, layout.PLAN: "0" * 64}),
    ("plan-bytes-bool", lambda d: {**d, layout.PLAN: {**d[layout.PLAN], "bytes": True}}),
    ("plan-bytes-negative", lambda d: {**d, layout.PLAN: {**d[layout.PLAN], "bytes": -1}}),
    ("experiment-number", lambda d: {**d, layout.EXPERIMENT: 1}),
    ("extra-name", lambda d: {**d, "other.json": "0" * 64}),
    ("non-ascii-mac", lambda d: {**d, "mac": {"algorithm": "x", "key_id": "é", "value": "é"}}),
]


@pytest.mark.parametrize("key", [KEY, None], ids=["keyed", "unkeyed"])
@pytest.mark.parametrize(
    "change", [c for _, c in RUN_SEAL_DAMAGE], ids=[n for n, _ in RUN_SEAL_DAMAGE]
)
def test_a_malformed_run_seal_is_invalid_naming_it(
    tmp_path: Path, change: Callable[[dict[str, Any]], Any], key: SealKey | None
) -> None:
    with sealing_with(key):
        store = ArtifactStore(tmp_path, "exp")
        store.initialize(experiment_document("exp"), [plan_row("c1")])
        [(_, path)] = run_seals(store.directory)
        document = json.loads(path.read_bytes())
        os.chmod(path, 0o644)
        path.write_bytes(json_bytes(change(document)))
        with pytest.raises(SealError) as caught:
            read_run_seal(path)
        assert caught.value.file == path.name
        statuses = {s.file: s for s in verify_run_files(store.directory)}
    seal = statuses[f"{layout.SEALS}/{path.name}"]
    assert seal.status == "invalid"
    assert "malformed" in seal.detail or "SHA-256 digest" in seal.detail


def test_a_flipped_byte_in_a_run_file_invalidates_its_seal(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path, "exp")
    store.initialize(experiment_document("exp"), [plan_row("c1")])
    experiment = store.directory / layout.EXPERIMENT
    data = bytearray(experiment.read_bytes())
    data[2] ^= 0x01
    os.chmod(experiment, 0o644)
    experiment.write_bytes(bytes(data))
    [seal] = [s for s in verify_run_files(store.directory) if s.file.startswith(layout.SEALS)]
    assert seal.status == "invalid" and seal.detail.startswith("experiment.json does not match")


# --------------------------------------------------------------------------- read once


def test_the_verifier_hands_back_the_bytes_it_hashed_and_readers_parse_them(tmp_path: Path) -> None:
    attempt = sealed_attempt(tmp_path)
    seal = read_seal(attempt, keep=("a.json",))
    assert hashlib.sha256(seal.contents["a.json"]).hexdigest() == seal.files["a.json"]
    # The file changes on disk after the check: the reader still parses what was checked.
    os.chmod(attempt / "a.json", 0o644)
    (attempt / "a.json").write_bytes(b'{"x": 2}\n')
    assert load_sealed_document(attempt, "a.json", seal, dict[str, int]) == {"x": 1}
    assert seal.read("a.json") == PAYLOADS["a.json"]


def test_a_file_not_kept_is_checked_from_the_bytes_read_when_it_is_read(tmp_path: Path) -> None:
    attempt = sealed_attempt(tmp_path)
    seal = read_seal(attempt, keep=("a.json",), every=False)
    assert seal.read("b.pt") == PAYLOADS["b.pt"]
    os.chmod(attempt / "b.pt", 0o644)
    (attempt / "b.pt").write_bytes(b"changed")
    with pytest.raises(SealError, match="SHA-256 does not match") as caught:
        seal.read("b.pt")
    assert caught.value.file == "b.pt"


def test_the_attribution_reader_parses_the_bytes_the_verifier_hashed(tmp_path: Path) -> None:
    directory = sealed_attribution(tmp_path)
    sealed = open_attribution(directory)
    data = sealed.contents[layout.ATTRIBUTION]
    assert hashlib.sha256(data).hexdigest() == sealed.files[layout.ATTRIBUTION]
    assert data == (directory / layout.ATTRIBUTION).read_bytes()
    os.chmod(directory / layout.ATTRIBUTION, 0o644)
    (directory / layout.ATTRIBUTION).write_bytes(b"not json")
    assert document_json(attribution_document(sealed)) == ATTRIBUTION
    with pytest.raises(SealError, match="SHA-256 does not match"):
        read_attribution(directory)


def test_the_manifest_digest_is_of_the_bytes_parsed(tmp_path: Path, kind: str) -> None:
    make, _, _ = KINDS[kind]
    directory = make(tmp_path)
    form = ATTEMPT_SEAL if kind == "attempt" else ATTRIBUTION_SEAL
    data = (directory / layout.COMPLETE).read_bytes()
    manifest = read_manifest(directory / layout.COMPLETE, form, name=layout.COMPLETE)
    assert manifest.sha256 == hashlib.sha256(data).hexdigest()
    assert json_bytes(manifest.document()) == data
