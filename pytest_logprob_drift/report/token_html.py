"""The per-sample token view on the page: compact data, drawn by a few lines of fixed script.

Owns how a detailed case's ``model.TokenView`` reaches the reader: each shown sample as one
line of its response tokens (decoded, or ids without a tokenizer), each token coloured by
|diff| on the log axis the page's histograms share (the decades ``(low, high)``), mismatches
outlined, each sample's first mismatch marked, and hovering or focusing a token (one Tab stop
per sample, then the arrow keys) showing its rollout and training logprobs, |diff| and id.
The tokens are not elements in the file: per sample its ids, positions and both sides'
logprobs are little-endian arrays in base64 (``float32`` when exact, else ``float64``), and
the decoded texts one table per case, all in one ``markup.json_script`` data block; the
page's fixed ``TOKEN_SCRIPT`` draws them with ``textContent`` (never as markup) and
recomputes |diff| = |training - rollout| in float64 and the mismatch rule from those exact
values. The static parts (headings, the per-sample line's caption) are built with
``markup.el``. Knows nothing about files, seals, torch or how the tokens were chosen.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pytest_logprob_drift.errors import one_line
from pytest_logprob_drift.records import JsonObject, JsonValue
from pytest_logprob_drift.report.markup import Markup, el, json_script
from pytest_logprob_drift.report.model import CaseView, SampleTokens, TokenView

DATA_ID = "token-data"
"""The id of the page's one token data block."""
RAMP_STEPS = 10
"""Colour steps over the log axis: step k holds |diff| in the k-th tenth of the decades."""


def _step_colour(step: int) -> str:
    f = step / (RAMP_STEPS - 1)
    return f"hsl({60 - 60 * f:.0f},100%,{88 - 38 * f:.0f}%)"


TOKEN_STYLE = Markup(
    """
div.tokens .line{font-family:ui-monospace,monospace;font-size:12px;line-height:1.9;
  overflow-wrap:anywhere;margin:.1em 0 .5em;min-height:1.9em}
div.tokens .tk{white-space:pre-wrap;padding:1px 0;border-radius:2px;cursor:default}
div.tokens.ids .tk{margin-right:.4em}
div.tokens .tk.mm{outline:1px solid #b00000;outline-offset:-1px}
div.tokens .tk.first{box-shadow:inset 3px 0 0 #b00000}
div.tokens .tk.first::before{content:"\\25B6";color:#b00000;font-size:9px}
div.tokens .tk:focus,div.tokens .tk:hover{outline:2px solid #204a87;outline-offset:0}
div.tokens .token-info{font-family:ui-monospace,monospace;font-size:12px;min-height:1.4em;
  background:#f4f4f4;padding:2px 6px;margin:.3em 0}
div.tokens .ramp span{display:inline-block;width:1.4em;height:.9em;vertical-align:middle}
"""
    + "".join(f"div.tokens .d{k}{{background:{_step_colour(k)}}}\n" for k in range(RAMP_STEPS))
)
"""The token view's fixed style (trusted markup: it holds no text from a run)."""

TOKEN_SCRIPT = Markup("""
(function () {
  var block = document.getElementById("token-data");
  if (!block) { return; }
  var cases = JSON.parse(block.textContent);
  function buffer(b64) {
    var s = atob(b64), a = new Uint8Array(s.length);
    for (var i = 0; i < s.length; i++) { a[i] = s.charCodeAt(i); }
    return a.buffer;
  }
  function step(d, low, high) {
    if (!(d > 0)) { return -1; }
    var f = (Math.log10(d) - low) / (high - low);
    return Math.max(0, Math.min(9, Math.floor(f * 10)));
  }
  function draw(box) {
    var c = cases[box.dataset.case];
    if (!c || box.dataset.drawn) { return; }
    box.dataset.drawn = "1";
    var Values = c.f8 ? Float64Array : Float32Array;
    var digits = c.f8 ? 17 : 9;
    var info = box.querySelector(".token-info");
    c.samples.forEach(function (s) {
      var x = {ids: new Int32Array(buffer(s.ids)), r: new Values(buffer(s.r)),
               t: new Values(buffer(s.t)), s: s.s, p0: s.p0, first: s.first,
               pos: s.pos === null ? null : new Int32Array(buffer(s.pos))};
      var line = box.querySelector(".line[data-sample='" + s.s + "']");
      var fragment = document.createDocumentFragment();
      for (var i = 0; i < x.ids.length; i++) {
        var d = Math.abs(x.t[i] - x.r[i]), p = x.pos === null ? x.p0 + i : x.pos[i];
        var text = c.texts === null ? undefined : c.texts[String(x.ids[i])];
        var span = document.createElement("span");
        span.textContent = text === undefined ? String(x.ids[i]) : text;
        var k = step(d, c.scale[0], c.scale[1]);
        span.className = "tk" + (k < 0 ? "" : " d" + k) + (d > c.threshold ? " mm" : "") +
          (p === x.first ? " first" : "");
        fragment.appendChild(span);
      }
      if (fragment.firstChild) { fragment.firstChild.tabIndex = 0; }
      line.appendChild(fragment);
      line.tokens = x;
    });
    function describe(span) {
      var line = span.parentNode, x = line.tokens;
      var i = Array.prototype.indexOf.call(line.children, span);
      var r = x.r[i], t = x.t[i], d = Math.abs(t - r), p = x.pos === null ? x.p0 + i : x.pos[i];
      return "sample " + x.s + ", position " + p + ": " + JSON.stringify(span.textContent) +
        " (id " + x.ids[i] + ")  rollout " + r.toPrecision(digits) +
        "  training " + t.toPrecision(digits) + "  |diff| " + d.toExponential(3) +
        (d > c.threshold ? "  MISMATCH" : "") + (p === x.first ? " (first of the sample)" : "");
    }
    function show(event) {
      var span = event.target;
      if (!span.classList || !span.classList.contains("tk")) { return; }
      var text = describe(span);
      info.textContent = text;
      span.title = text;
    }
    box.addEventListener("mouseover", show);
    box.addEventListener("focusin", show);
    box.addEventListener("keydown", function (event) {
      var span = event.target;
      if (!span.classList || !span.classList.contains("tk")) { return; }
      var next = event.key === "ArrowRight" ? span.nextElementSibling
        : event.key === "ArrowLeft" ? span.previousElementSibling : null;
      if (next) { span.tabIndex = -1; next.tabIndex = 0; next.focus(); event.preventDefault(); }
    });
  }
  var boxes = document.querySelectorAll("div.tokens[data-case]");
  if (!("IntersectionObserver" in window)) { boxes.forEach(draw); return; }
  var observer = new IntersectionObserver(function (entries) {
    entries.forEach(function (e) {
      if (e.isIntersecting) { observer.unobserve(e.target); draw(e.target); }
    });
  }, {rootMargin: "600px 0px"});
  boxes.forEach(function (box) { observer.observe(box); });
})();
""")
"""The token view's fixed script (trusted markup: it holds no text from a run; it reads the
data block and writes only ``textContent``, ``title``, classes and tab stops). A case's tokens
are drawn when its view comes near the window, so a page of many cases opens at once."""


def _b64(array: np.ndarray[Any, Any], dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(array, dtype=dtype).tobytes()).decode("ascii")


def _display(text: str) -> str:
    """A token's text as the view shows it: a line break as a visible symbol, every other
    non-printable character as the terminal shows it (``errors.one_line``)."""
    return one_line(text.replace("\n", "\u23ce"))


def _sample(sample: SampleTokens, f8: bool) -> JsonObject:
    positions = sample.positions
    first = int(positions[0]) if positions.size else 0
    contiguous = bool(np.array_equal(positions, np.arange(first, first + positions.size)))
    values = "<f8" if f8 else "<f4"
    return {
        "s": sample.sample,
        "p0": first,
        "pos": None if contiguous else _b64(positions, "<i4"),
        "ids": _b64(sample.token_ids, "<i4"),
        "r": _b64(sample.rollout, values),
        "t": _b64(sample.training, values),
        "first": sample.first_mismatch,
    }


def case_data(view: TokenView, decades: tuple[int, int]) -> JsonObject:
    """One case's entry of the data block."""
    f8 = any(s.rollout.dtype == np.float64 or s.training.dtype == np.float64 for s in view.samples)
    return {
        "threshold": view.threshold,
        "scale": [decades[0], decades[1]],
        "f8": f8,
        "texts": {str(k): _display(v) for k, v in view.texts.items()} if view.texts else None,
        "samples": [_sample(s, f8) for s in view.samples],
    }


def data_block(cases: Sequence[CaseView], decades: tuple[int, int]) -> Markup | None:
    """The page's one data block: the token view of every detailed case, by case id."""
    document: Mapping[str, JsonValue] = {
        v.case_id: case_data(v.detail.tokens, decades)
        for v in cases
        if v.detail is not None and v.detail.tokens is not None
    }
    return json_script(DATA_ID, document) if document else None


def sample_anchor(case_id: str, sample: int) -> str:
    """The id of a sample's line in a case's token view (a link target)."""
    return f"tokens-{case_id}-{sample}"


def _caption(sample: SampleTokens) -> str:
    shown = sample.positions.size
    where = (
        f"all {sample.length} response tokens"
        if shown == sample.length
        else f"{shown} of {sample.length} response tokens, positions "
        f"{int(sample.positions[0])}-{int(sample.positions[-1])}"
    )
    first = (
        "no mismatch"
        if sample.first_mismatch is None
        else f"first mismatch at position {sample.first_mismatch}"
    )
    return f"sample {sample.sample}: {where}; {first}"


def token_section(view: CaseView, decades: tuple[int, int]) -> Markup | None:
    """The token view of a detailed case (its lines are filled by ``TOKEN_SCRIPT``)."""
    tokens = None if view.detail is None else view.detail.tokens
    if tokens is None:
        return None
    low, high = decades
    shown = len(tokens.samples)
    which = (
        f"all {shown} samples"
        if shown == tokens.total_samples
        else f"{shown} of {tokens.total_samples} samples ("
        + ("an imported step's worst, then " if tokens.required else "")
        + "largest max |diff|)"
    )
    lines = (
        el(
            "div",
            el("div", _caption(s), class_="muted"),
            el("div", class_="line", data_sample=s.sample, role="group", aria_label=_caption(s)),
            class_="sample",
            id=sample_anchor(view.case_id, s.sample),
        )
        for s in tokens.samples
    )
    return el(
        "div",
        el(
            "h3",
            "Tokens by sample ",
            el("span", f"({which}; {'decoded' if tokens.texts else 'token ids'})", class_="muted"),
        ),
        el(
            "p",
            f"|diff| colour, log scale 1e{low} ",
            el("span", (el("span", class_=f"d{k}") for k in range(RAMP_STEPS)), class_="ramp"),
            f" 1e{high} (the histograms' axis; uncoloured: exactly 0); outlined: mismatch "
            f"(|diff| > {tokens.threshold:g}; {RAMP_STEPS} colour steps); \u25b6: the sample's "
            "first mismatch. Hover a "
            "token, or Tab to a sample and use \u2190/\u2192, for its logprobs.",
            class_="muted",
        ),
        el("p", "(hover or focus a token)", class_="token-info", aria_live="polite"),
        lines,
        class_="tokens" if tokens.texts else "tokens ids",
        data_case=view.case_id,
    )
