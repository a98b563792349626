"""HTML written by building elements: text is escaped unless it is marked as trusted markup.

Owns the report's one rule for writing HTML (the idea of ``markupsafe.Markup``): ``Markup`` is
a ``str`` that already is HTML and passes unchanged; anything else is text and is escaped
(``escape``: shown as the terminal shows it, every non-printable character such as a line
break, a terminal escape or a bidirectional override written as its escape sequence by
``errors.one_line``, then HTML-escaped, quotes included). ``el`` builds an element from a tag,
children and attributes: every text child and attribute value is escaped, tag and attribute
names are checked, raw-text elements (whose content escaping cannot protect), event-handler and
``style`` attributes are refused, and a link may only be in-page (``#``) or relative to the
page (``./``, ``../``), so no text can turn into a URL scheme. ``join`` escapes and joins.
``page_link`` writes a relative file path as such a link (by its file-system bytes).
``json_script`` writes data for the page's fixed script as a ``<script type="application/json">``
block whose JSON has every ``<``, ``>`` and ``&`` written as a ``\\u`` escape (so no text can
end the block). Knows nothing about the report or where its text comes from.
"""

from __future__ import annotations

import html
import json
import os
import re
from collections.abc import Iterable
from typing import TypeAlias
from urllib.parse import quote

from pytest_logprob_drift.errors import one_line


class Markup(str):
    """Trusted HTML: passes the builder unchanged. Mark only markup this package produces
    whole (the page's fixed style and script, matplotlib's SVG), never text from a run."""

    __slots__ = ()

    def __add__(self, other: str, /) -> Markup:
        return Markup(str.__add__(self, escape(other)))

    def __radd__(self, other: str, /) -> Markup:
        return Markup(str.__add__(escape(other), self))


Child: TypeAlias = "Markup | str | int | float | Iterable[Child] | None"
"""What an element holds: text (escaped), markup, numbers (as text), None (nothing), or any
iterable of these (flattened)."""
AttributeValue: TypeAlias = "str | int | float | bool | None"
"""An attribute's value: text or a number (escaped), True (the bare name), False or None (the
attribute is left out)."""

_NAME = re.compile(r"[a-z][a-z0-9]*\Z")
_ATTRIBUTE = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*\Z")
RAW_TEXT = frozenset({"script", "style", "iframe", "noembed", "noframes", "noscript", "xmp"})
"""Elements whose content the parser does not decode (escaping cannot protect it) or that load
or hide content: ``el`` refuses them; the page's fixed script and style are markup."""
VOID = frozenset({"br", "hr", "img", "input", "link", "meta", "wbr"})
"""Elements without content or end tag."""
URL_ATTRIBUTES = frozenset({"action", "background", "cite", "formaction", "href", "poster", "src"})
"""Attributes that hold a URL: only in-page or page-relative links are written."""
SAFE_LINK = ("#", "./", "../")


def escape(value: object) -> Markup:
    """``value`` as HTML: markup unchanged, anything else as escaped text."""
    if isinstance(value, Markup):
        return value
    return Markup(html.escape(one_line(str(value)), quote=True))


def _children(children: Iterable[Child]) -> Iterable[Markup]:
    for child in children:
        if child is None:
            continue
        if isinstance(child, (str, int, float)):
            yield escape(child)
        else:
            yield from _children(child)


def join(children: Iterable[Child], separator: Child = "") -> Markup:
    """The children escaped and joined by ``separator`` (escaped too unless markup)."""
    return Markup(escape(separator).join(_children(children)))


def _attribute_name(key: str) -> str:
    """``class_`` -> ``class``, ``data_v`` -> ``data-v``; refused when not a plain name."""
    name = key.rstrip("_").replace("_", "-")
    if not _ATTRIBUTE.match(name):
        raise ValueError(f"not an attribute name: {key!r}")
    if name.startswith("on") or name == "style":
        raise ValueError(f"attribute {name!r} is refused: the page runs no markup-borne code")
    return name


def _attributes(attributes: dict[str, AttributeValue]) -> str:
    parts = []
    for key, value in attributes.items():
        name = _attribute_name(key)
        if value is None or value is False:
            continue
        if value is True:
            parts.append(f" {name}")
            continue
        text = str(value)
        if name in URL_ATTRIBUTES and not text.startswith(SAFE_LINK):
            raise ValueError(f"{name}={text!r}: only in-page or page-relative links are written")
        parts.append(f" {name}='{escape(text)}'")
    return "".join(parts)


def el(tag: str, *children: Child, **attributes: AttributeValue) -> Markup:
    """The element ``<tag attributes>children</tag>``: text children and attribute values
    escaped; markup children unchanged. Attribute names come from keywords (``class_``,
    ``data_case``); their order is kept."""
    if not _NAME.match(tag):
        raise ValueError(f"not a tag name: {tag!r}")
    if tag in RAW_TEXT:
        raise ValueError(f"<{tag}> is refused: its content is not escaped by the parser")
    start = f"<{tag}{_attributes(attributes)}>"
    if tag in VOID:
        if any(True for _ in _children(children)):
            raise ValueError(f"<{tag}> has no content")
        return Markup(start)
    return Markup(f"{start}{join(children)}</{tag}>")


def page_link(path: str) -> str:
    """A file path relative to the page as a link: its file-system bytes percent-encoded (no
    character of a name can end the path or start a query, a fragment or a scheme; a name whose
    bytes are not UTF-8, held as lone surrogates, links by those bytes: ``%FF``) and starting
    ``./`` or ``../``."""
    if path.startswith("/"):
        raise ValueError(f"not a relative path: {path!r}")
    encoded = quote(os.fsencode(path), safe="/")
    return encoded if encoded.startswith("../") else f"./{encoded}"


def fragment_link(anchor: str) -> str:
    """A link to the element whose ``id`` is ``anchor``."""
    return "#" + quote(anchor, safe="")


_SCRIPT_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"}


def json_script(element_id: str, document: object) -> Markup:
    """``document`` as a ``<script type="application/json" id=element_id>`` data block: JSON
    (ASCII, no NaN), with ``<``, ``>`` and ``&`` escaped, so the block holds no markup and
    cannot be ended by any text in it; read back with ``JSON.parse(block.textContent)``."""
    if not _ATTRIBUTE.match(element_id):
        raise ValueError(f"not an element id: {element_id!r}")
    text = json.dumps(document, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    for char, escaped in _SCRIPT_ESCAPES.items():
        text = text.replace(char, escaped)
    return Markup(f'<script type="application/json" id="{element_id}">{text}</script>')
