"""Installed distributions' entry points, read directly from their metadata directories.

Owns finding the entry points of a group the way ``importlib.metadata.entry_points`` does
(every ``*.dist-info``/``*.egg-info`` on ``sys.path``, the first distribution of a name wins)
at a fraction of its cost: one scan of ``sys.path`` per process (cached until ``sys.path``
changes), reading only ``entry_points.txt`` files and parsing only the groups asked for,
without importing ``importlib.metadata`` and the e-mail parser it pulls in, which dominated
the start-up of ``plan``. Any ``sys.path`` entry that is not a directory (a zip archive) falls
back to ``importlib.metadata``. Loading an entry point imports its module only then. Knows
nothing about what the entry points provide.
"""

from __future__ import annotations

import importlib
import os
import re
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time)
if TYPE_CHECKING:
    from typing import Any

_DIST_DIR = re.compile(r"(?P<name>[^-]+)(?:-[^/]*)?\.(?:dist|egg)-info")
_DIST_SUFFIXES = (".dist-info", ".egg-info")
_SEPARATORS = re.compile(r"[-_.]+")
_SECTION = re.compile(r"\[(?P<group>[^\]]+)\]")


class EntryPoint:
    """``name = value`` of ``group``; ``value`` is ``module:attr`` (maybe with ``[extras]``)."""

    __slots__ = ("group", "name", "value")

    def __init__(self, *, name: str, value: str, group: str) -> None:
        self.name = name
        self.value = value
        self.group = group

    def __repr__(self) -> str:
        return f"EntryPoint(name={self.name!r}, value={self.value!r}, group={self.group!r})"

    def load(self) -> Any:
        reference = self.value.split("[", 1)[0].strip()
        module_name, _, attrs = reference.partition(":")
        target: Any = importlib.import_module(module_name.strip())
        for attr in filter(None, attrs.strip().split(".")):
            target = getattr(target, attr)
        return target


_cache: tuple[tuple[str, ...], _Installed] | None = None


class _Installed:
    """The entry points of one ``sys.path``: every ``entry_points.txt`` read once, each group's
    section parsed only when asked for (a scan finds dozens of files; a process asks for two
    groups)."""

    __slots__ = ("groups", "texts")

    def __init__(self, texts: list[str], groups: dict[str, list[EntryPoint]] | None = None) -> None:
        self.texts = texts
        self.groups: dict[str, list[EntryPoint]] = groups if groups is not None else {}

    def select(self, group: str) -> list[EntryPoint]:
        if group not in self.groups:
            self.groups[group] = [
                entry
                for text in self.texts
                if group in text
                for entry in _parse(text)
                if entry.group == group
            ]
        return self.groups[group]


def select(group: str) -> list[EntryPoint]:
    """Every entry point of ``group`` (one per distribution and name), in discovery order."""
    global _cache
    key = tuple(sys.path)
    if _cache is None or _cache[0] != key:
        _cache = (key, _scan(key))
    return list(_cache[1].select(group))


def _normalized(name: str) -> str:
    return _SEPARATORS.sub("_", name).lower()


def _scan(paths: tuple[str, ...]) -> _Installed:
    if any(p and not os.path.isdir(p) and os.path.exists(p) for p in paths):
        return _from_importlib_metadata()
    texts: list[str] = []
    seen: set[str] = set()
    for path in paths:
        try:
            names = sorted(os.listdir(path or "."))
        except OSError:
            continue
        for directory in names:
            if not directory.endswith(_DIST_SUFFIXES):
                continue
            match = _DIST_DIR.fullmatch(directory)
            if match is None:
                continue
            name = _normalized(match.group("name"))
            if name in seen:
                continue
            seen.add(name)
            file = os.path.join(path or ".", directory, "entry_points.txt")
            if not os.access(file, os.R_OK):  # most have none: no exception raised per miss
                continue
            try:
                with open(file, encoding="utf-8") as handle:
                    texts.append(handle.read())
            except (OSError, ValueError):
                continue
    return _Installed(texts)


def _parse(text: str) -> list[EntryPoint]:
    entries: list[EntryPoint] = []
    group = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        section = _SECTION.fullmatch(line)
        if section is not None:
            group = section.group("group").strip()
            continue
        name, sep, value = line.partition("=")
        if group is not None and sep:
            entries.append(EntryPoint(name=name.strip(), value=value.strip(), group=group))
    return entries


def _from_importlib_metadata() -> _Installed:
    import importlib.metadata

    groups: dict[str, list[EntryPoint]] = {}
    seen: set[str] = set()
    for distribution in importlib.metadata.distributions():
        name = _normalized(distribution.metadata["Name"] or "")
        if name in seen:
            continue
        seen.add(name)
        for entry in distribution.entry_points:
            groups.setdefault(entry.group, []).append(
                EntryPoint(name=entry.name, value=entry.value, group=entry.group)
            )
    return _Installed([], groups=groups)
