"""The report's element builder (``report.markup``): text is escaped unless it is marked as
markup, attribute values too, names are checked, links stay in-page or page-relative; and the
plots draw a case label as the plain text it is (never mathtext)."""

from __future__ import annotations

import os
import re
from html.parser import HTMLParser

import pytest

from pytest_logprob_drift.numerics.comparison import STATISTICS_KEYS, Diagnostics, Statistics
from pytest_logprob_drift.report import plots
from pytest_logprob_drift.report.markup import Markup, el, escape, join, page_link
from pytest_logprob_drift.report.model import CaseView
from tests import attribution_records as records

HOSTILE = "'\"><script>document.title='pwned'</script><img src=x onerror=alert(1)>&amp;"


class _Elements(HTMLParser):
    """Every start tag with its attributes, and the text, as a browser's parser reads them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parsed(markup: str) -> _Elements:
    parser = _Elements()
    parser.feed(markup)
    parser.close()
    return parser


def test_text_is_escaped_and_reads_back_as_the_same_text() -> None:
    page = el("p", HOSTILE)
    assert "<script>" not in page and "<img" not in page
    read = parsed(page)
    assert [tag for tag, _ in read.tags] == ["p"]
    assert "".join(read.text) == HOSTILE


def test_attribute_values_are_escaped() -> None:
    page = el("td", "x", class_="n", data_case=HOSTILE, title=HOSTILE)
    read = parsed(page)
    assert read.tags == [("td", {"class": "n", "data-case": HOSTILE, "title": HOSTILE})]
    assert page.startswith("<td class='n' data-case='&#x27;&quot;&gt;&lt;script&gt;")


def test_markup_passes_and_is_never_escaped_twice() -> None:
    svg = Markup("<svg><text>a &amp; b</text></svg>")
    page = el("figure", svg, el("figcaption", "a & b"), class_="plot")
    assert page == (
        "<figure class='plot'><svg><text>a &amp; b</text></svg>"
        "<figcaption>a &amp; b</figcaption></figure>"
    )
    assert isinstance(page, Markup)
    assert el("p", page).count("&amp;amp;") == 0
    # Joining markup with text escapes the text only.
    assert svg + "<b>" == "<svg><text>a &amp; b</text></svg>&lt;b&gt;"
    assert "<b>" + Markup("<i>") == "&lt;b&gt;<i>"
    assert join(["<x>", Markup("<br>"), 3, None, [1.5, "y"]], " > ") == (
        "&lt;x&gt; &gt; <br> &gt; 3 &gt; 1.5 &gt; y"
    )


def test_attribute_forms() -> None:
    assert el("details", "x", open=True) == "<details open>x</details>"
    assert el("td", "x", class_=None, data_v=False) == "<td>x</td>"
    assert el("meta", charset="utf-8") == "<meta charset='utf-8'>"
    with pytest.raises(ValueError, match="no content"):
        el("meta", "text")


def test_non_printable_text_is_shown_as_the_terminal_shows_it() -> None:
    """Bidi overrides, terminal escapes and line breaks are written as escape sequences."""
    text = "a\u202eb\u2066c\x1b[2Jd\ne\u200f"
    shown = escape(text)
    assert not any(ch in shown for ch in "\u202e\u2066\x1b\n\u200f")
    assert shown == "a\\u202eb\\u2066c\\x1b[2Jd\\ne\\u200f"
    assert "\u202e" not in el("code", "x\u202ey", title="\u202e")


@pytest.mark.parametrize(
    "tag", ["script", "style", "iframe", "noscript", "scr ipt", "a>", "", "A", "p/", "1p", "x:y"]
)
def test_bad_or_raw_text_tags_are_refused(tag: str) -> None:
    with pytest.raises(ValueError):
        el(tag, "text")


@pytest.mark.parametrize(
    "name", ["onclick", "onerror", "ONLOAD_", "style", "a b", "x='y'", "data-", "-x", "a>b"]
)
def test_bad_or_code_bearing_attribute_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        el("p", "text", **{name: "v"})


@pytest.mark.parametrize(
    "url",
    ["javascript:alert(1)//x/cases/a", "JAVASCRIPT:x", "data:text/html,<b>", "//evil/x", "/etc/x"],
)
def test_only_in_page_or_page_relative_links_are_written(url: str) -> None:
    with pytest.raises(ValueError, match="page-relative"):
        el("a", "x", href=url)
    with pytest.raises(ValueError, match="page-relative"):
        el("img", src=url)


def test_a_relative_file_path_becomes_a_relative_link() -> None:
    """A directory named like a URL scheme stays a path: ``./`` first, characters that could
    end the path (``?``, ``#``) or start a scheme (``:``) percent-encoded."""
    assert page_link("javascript:alert(1)/x/cases/c/a/comparison.json") == (
        "./javascript%3Aalert%281%29/x/cases/c/a/comparison.json"
    )
    assert page_link("cases/a?b#c/COMPLETE") == "./cases/a%3Fb%23c/COMPLETE"
    assert page_link("../runs/x/COMPLETE") == "../runs/x/COMPLETE"
    assert el("a", "x", href=page_link("javascript:x")) == "<a href='./javascript%3Ax'>x</a>"
    with pytest.raises(ValueError):
        page_link("/etc/hostname")


def test_a_name_whose_bytes_are_not_utf8_links_by_its_bytes() -> None:
    """Python holds the byte 0xff of a file name as the lone surrogate U+DCFF: the link names
    the byte (``%FF``), as a UTF-8 name's link names its UTF-8 bytes."""
    assert page_link(os.fsdecode(b"../run-\xff/\xc3\xa9/COMPLETE")) == "../run-%FF/%C3%A9/COMPLETE"


# --------------------------------------------------------------------------- plot labels

MATHTEXT = [r"$\frac{1}{0}$", "$$", r"\$", "a=$x$ b=$", r"$\alpha$", "<b>&x</b>"]
"""Labels that matplotlib would parse as mathtext (or that need escaping in SVG)."""


def _view(label: str, i: int) -> CaseView:
    return CaseView(
        case_id=f"c{i}",
        label=label,
        changed=("knob",),
        outcome="PASS",
        reason="",
        attempt_id="a",
        active_tokens=1,
        mismatches=0,
        threshold=1e-3,
        diagnostics=Diagnostics.of(
            Statistics(
                **{
                    **dict.fromkeys(STATISTICS_KEYS, 1e-6),
                    "max_abs_diff": 1e-4 * (i + 1),
                    "p99_abs_diff": 1e-5,
                }
            )
        ),
        records=(),
        identity_violations=(),
        files=(),
        attribution=None,
        detail=None,
    )


def _texts(svg: str) -> list[str]:
    return [
        t.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
        for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    ]


@pytest.mark.slow
def test_plot_labels_are_plain_text_never_mathtext() -> None:
    pytest.importorskip("matplotlib")
    svg = plots.overview_svg([_view(label, i) for i, label in enumerate(MATHTEXT)], 1e-3)
    assert svg is not None
    assert all(label in _texts(svg) for label in MATHTEXT), _texts(svg)
    effect = records.case_data("x")["effect"] | {"mean_ratio": records.ratio(2.0, 1.5, 3.0)}
    document = records.attribution(
        [records.case_data(label, effect=effect) for label in MATHTEXT], list(MATHTEXT)
    )
    svg = plots.attribution_svg(document)
    assert svg is not None
    assert all(label in _texts(svg) for label in MATHTEXT), _texts(svg)
    assert "<b>" not in svg
