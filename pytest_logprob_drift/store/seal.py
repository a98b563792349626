"""The one seal mechanism: a manifest of file digests under a header, with an optional MAC.

Owns the manifest record and its JSON form (a ``SealForm`` says, per kind of seal, which header
fields it carries and of what JSON type, where its digests sit and which names it may cover),
writing a manifest (with ``mac`` under the active seal key, ``store.keys``), and verifying one:
the manifest is read once and parsed strictly (any wrong type, key or name is a ``SealError``
naming the file at fault), its MAC checked under the active key, and every covered file read
once, the bytes hashed being the bytes handed to the caller (``Sealed.contents``), so nothing
checked is read again. Knows nothing about what the sealed files contain, nor about attempts,
attributions or runs beyond the forms their owners declare.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec

from pytest_logprob_drift.records import JsonObject, JsonValue
from pytest_logprob_drift.store import layout
from pytest_logprob_drift.store.decode import Document, JSONDocumentError, decode
from pytest_logprob_drift.store.files import (
    PUBLISH_TEMPORARY,
    NotRegularFileError,
    hash_fd,
    json_bytes,
    open_regular,
    plain_name,
    publish_bytes,
    read_fd,
    read_regular,
)
from pytest_logprob_drift.store.keys import SealKey, active_key

MAX_SEAL_BYTES = 16 << 20
"""A manifest larger than this is refused unread."""


class SealError(Exception):
    """A sealed directory or file is partial, malformed or tampered; ``file`` names the culprit."""

    def __init__(self, file: str, message: str) -> None:
        self.file = file
        self.message = message
        super().__init__(f"{file}: {message}")


Sha256 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
"""A SHA-256 digest as a manifest records it: 64 lowercase hex digits."""
_Printable = Annotated[str, msgspec.Meta(pattern="^[ -~]*$")]


class MacRecord(Document, frozen=True, kw_only=True):
    """A manifest's ``mac`` (``store.keys.SealKey.mac``)."""

    algorithm: _Printable
    key_id: _Printable
    value: _Printable


class PrefixDigest(Document, frozen=True, kw_only=True):
    """A digest of the first ``bytes`` bytes of a file that only grows (``plan.jsonl``)."""

    bytes: Annotated[int, msgspec.Meta(ge=0)]
    sha256: Sha256


class ManifestDocument(Document, frozen=True, kw_only=True):
    """The members every manifest may have besides its form's own: ``mac``."""

    mac: MacRecord | msgspec.UnsetType = msgspec.UNSET


class FilesManifest(ManifestDocument, frozen=True, kw_only=True):
    """A manifest whose digests sit under ``files`` (name -> SHA-256)."""

    files: dict[str, Sha256]


@dataclass(frozen=True, slots=True, kw_only=True)
class SealForm:
    """How one kind of seal is written: its header, where its digests sit, what it covers."""

    what: str
    """The kind in messages: ``seal``, ``attribution seal``, ``run seal``."""
    document: type[ManifestDocument]
    """The manifest's type: the header fields, then the digests (``files``, or one member per
    covered name), then ``mac``; decoded at the store's edge (``store.decode``)."""
    header: tuple[str, ...]
    """Header fields, in the order messages list them."""
    files_key: str | None = "files"
    """The key of the name -> digest map; None: each covered name is a key of its own."""
    covers: frozenset[str] | None = None
    """The exact names covered (None: any plain names but COMPLETE)."""
    prefixes: frozenset[str] = frozenset()
    """Names sealed as a prefix: ``{"bytes": n, "sha256": digest of the first n bytes}``."""

    @property
    def keys(self) -> tuple[str, ...]:
        """The keys of a manifest of this form, besides ``mac``."""
        if self.files_key is not None:
            return (*self.header, self.files_key)
        return (*self.header, *sorted(self.covers or ()))


@dataclass(frozen=True, slots=True, kw_only=True)
class Digest:
    """The SHA-256 a manifest records for one file."""

    sha256: str
    length: int | None = None
    """For a prefix seal, the digest covers the first ``length`` bytes only."""

    def matches(self, data: bytes) -> bool:
        if self.length is not None:
            if len(data) < self.length:
                return False
            data = data[: self.length]
        return hashlib.sha256(data).hexdigest() == self.sha256

    def to_json(self) -> str | JsonObject:
        if self.length is None:
            return self.sha256
        return {"bytes": self.length, "sha256": self.sha256}


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    """A parsed (or written) seal: its header, the digest of every covered file, its MAC."""

    form: SealForm
    header: Mapping[str, JsonValue]
    files: Mapping[str, Digest]
    mac: Mapping[str, str] | None = None
    """The keyed seal (``store.keys``), when it was sealed with a key."""
    sha256: str | None = None
    """The digest of the manifest's own bytes as read or written."""

    def body(self) -> JsonObject:
        """The manifest's JSON without ``mac``: what a MAC seals."""
        digests = {name: digest.to_json() for name, digest in self.files.items()}
        if self.form.files_key is None:
            return {**self.header, **digests}
        return {**self.header, self.form.files_key: digests}

    def document(self) -> JsonObject:
        document = self.body()
        if self.mac is not None:
            document["mac"] = dict(self.mac)
        return document

    def mac_problem(self, key: SealKey) -> str | None:
        """Why this manifest is not sealed under ``key`` (None when it is)."""
        return key.problem(self.body(), None if self.mac is None else dict(self.mac))


def new_manifest(
    form: SealForm, header: Mapping[str, JsonValue], files: Mapping[str, Digest | str]
) -> Manifest:
    """A manifest to write: digests sorted by name, ``mac`` under the active seal key."""
    manifest = Manifest(
        form=form,
        header=dict(header),
        files={
            name: digest if isinstance(digest, Digest) else Digest(sha256=digest)
            for name, digest in sorted(files.items())
        },
    )
    key = active_key()
    if key is None:
        return manifest
    return Manifest(
        form=form, header=manifest.header, files=manifest.files, mac=key.mac(manifest.body())
    )


def write_manifest(directory: Path, name: str, manifest: Manifest) -> Manifest:
    """Publish ``manifest`` as ``directory/name`` (exclusively: FileExistsError rather than
    overwrite); returns it with the digest of the bytes written."""
    digest = publish_bytes(directory, name, json_bytes(manifest.document()))
    return Manifest(
        form=manifest.form,
        header=manifest.header,
        files=manifest.files,
        mac=manifest.mac,
        sha256=digest,
    )


# --------------------------------------------------------------------------- reading


def parse_manifest(data: bytes, form: SealForm, name: str) -> Manifest:
    """The manifest in ``data`` (the bytes of file ``name``), decoded into its form's type
    (``store.decode``): SealError naming the JSON path otherwise."""
    try:
        decode(data, form.document)  # the form's type checks it; its values are read below
    except JSONDocumentError as exc:
        raise SealError(name, f"malformed {form.what}: {exc}") from None
    # the JSON values of the same bytes, untyped, in C (the typed record keeps tuples)
    document: dict[str, Any] = msgspec.json.decode(data)
    if form.files_key is None:
        entries: dict[str, Any] = {n: document[n] for n in sorted(form.covers or ())}
    else:
        entries = document[form.files_key]
        if form.covers is not None and set(entries) != form.covers:
            raise SealError(
                name, f"malformed {form.what}: files must cover {', '.join(sorted(form.covers))}"
            )
    files = {entry: _digest(form, name, entry, value) for entry, value in entries.items()}
    return Manifest(
        form=form,
        header={key: document[key] for key in form.header},
        files=files,
        mac=document.get("mac"),
        sha256=hashlib.sha256(data).hexdigest(),
    )


def _digest(form: SealForm, name: str, entry: str, value: Any) -> Digest:
    if not plain_name(entry) or entry == layout.COMPLETE:
        raise SealError(
            name,
            f"seal entry {entry!r} is not a plain file name inside the sealed directory "
            "(no '/', '..', absolute or hidden names)",
        )
    if isinstance(value, dict):  # a PrefixDigest: its form declares the name a prefix
        return Digest(sha256=value["sha256"], length=value["bytes"])
    return Digest(sha256=value)


def read_manifest(path: Path, form: SealForm, *, name: str, missing: str = "missing") -> Manifest:
    """Read the manifest file ``path`` once (a regular file of at most ``MAX_SEAL_BYTES``) and
    parse it; errors name ``name`` (``missing`` says why a missing file matters). The MAC is
    not checked here (``check_mac``)."""
    try:
        fd, size = open_regular(path)
    except FileNotFoundError:
        raise SealError(name, missing) from None
    except OSError as exc:
        raise SealError(name, f"unreadable: {exc.strerror or exc}") from None
    try:
        if size > MAX_SEAL_BYTES:
            raise SealError(name, f"larger than {MAX_SEAL_BYTES} bytes; refused")
        data = read_fd(fd, size)
    except OSError as exc:
        raise SealError(name, f"unreadable: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return parse_manifest(data, form, name)


def check_mac(manifest: Manifest, name: str) -> None:
    """Under an active seal key, refuse a manifest without a valid MAC (``store.keys``)."""
    key = active_key()
    if key is None:
        return
    problem = manifest.mac_problem(key)
    if problem is not None:
        raise SealError(name, problem)


@contextlib.contextmanager
def sealed_file_errors(name: str) -> Iterator[None]:
    """Opening or reading the sealed file ``name``: any OS error becomes a SealError naming it
    (missing; a link or other non-regular file, refused; unreadable)."""
    try:
        yield
    except FileNotFoundError:
        raise SealError(name, "sealed file is missing") from None
    except NotRegularFileError as exc:
        raise SealError(name, f"{exc.strerror}; refused") from None
    except OSError as exc:
        raise SealError(name, f"unreadable: {exc.strerror or exc}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class Sealed:
    """A verified manifest of a directory and the bytes of the files it was asked to keep."""

    directory: Path
    manifest: Manifest
    contents: Mapping[str, bytes] = field(default_factory=dict, repr=False, compare=False)
    """The very bytes that were hashed and matched the manifest, by name."""

    @property
    def files(self) -> Mapping[str, str]:
        """The SHA-256 of every covered file, by name."""
        return {name: digest.sha256 for name, digest in self.manifest.files.items()}

    @property
    def mac(self) -> Mapping[str, str] | None:
        return self.manifest.mac

    def read(self, name: str) -> bytes:
        """The bytes of covered file ``name``: those kept (already checked), else read now,
        once (a regular file only), and checked against the manifest."""
        if name in self.contents:
            return self.contents[name]
        digest = self.manifest.files.get(name)
        if digest is None:
            raise SealError(name, "required file is not sealed")
        with sealed_file_errors(name):
            data = read_regular(self.directory / name)
        if not digest.matches(data):
            raise SealError(name, "SHA-256 does not match the seal (tampered or corrupt)")
        return data


def verify_directory(
    directory: Path, manifest: Manifest, *, keep: Collection[str] = (), every: bool = True
) -> dict[str, bytes]:
    """Check a directory sealed by ``manifest`` (whose own file is ``COMPLETE``): its MAC under
    the active key, nothing but regular files, nothing uncovered (a publish's leftover
    temporary name aside), and the digest of every covered file (``every``; otherwise of the
    kept ones only, the rest checked by ``Sealed.read`` when read). Each file is read once; the
    bytes of the names in ``keep`` are returned: the very bytes hashed."""
    check_mac(manifest, layout.COMPLETE)
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError as exc:
        raise SealError(
            layout.COMPLETE, f"cannot list the directory: {exc.strerror or exc}"
        ) from None
    for entry in entries:
        if entry.is_symlink():
            raise SealError(
                entry.name, "is a symbolic link; a sealed directory holds regular files only"
            )
        if not entry.is_file(follow_symlinks=False):
            raise SealError(entry.name, "is not a regular file; refused")
        # A crash between linking a file into place and removing its temporary name leaves
        # that name behind (for COMPLETE, in an otherwise sealed directory): never a payload.
        if entry.name == layout.COMPLETE or PUBLISH_TEMPORARY.fullmatch(entry.name):
            continue
        if entry.name not in manifest.files:
            raise SealError(entry.name, "file is not covered by the seal")
    contents: dict[str, bytes] = {}
    for name, digest in sorted(manifest.files.items()):
        if name in keep or every:
            if (
                _file_digest(directory / name, name, contents if name in keep else None)
                != digest.sha256
            ):
                raise SealError(name, "SHA-256 does not match the seal (tampered or corrupt)")
    return contents


def _file_digest(path: Path, name: str, keep: dict[str, bytes] | None) -> str:
    with sealed_file_errors(name):
        fd, size = open_regular(path)
    try:
        if keep is None:
            return hash_fd(fd)
        data = read_fd(fd, size)
        keep[name] = data
        return hashlib.sha256(data).hexdigest()
    except OSError as exc:
        raise SealError(name, f"unreadable: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
