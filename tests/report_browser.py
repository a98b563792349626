"""Headless Chromium for the report tests, driven over the DevTools protocol on a pipe.

``open_page`` loads a report page from disk in Debian's ``chromium`` (``--headless
--remote-debugging-pipe``: JSON messages on fds 3/4, no port, no extra package) and returns
what a reader would meet: every console error and uncaught exception, every URL the page
requested, each plot's box and pixel variance (a screenshot of just that region), the case
table's rows with their computed background colour, and a full-page screenshot kept as a test
artifact. ``live_page`` keeps a page open at a fixed viewport for a test to drive (scripts,
mouse moves, key presses). ``require_chromium`` skips with a reason outside CI when Chromium is
missing, and fails in CI (``CI`` set), where ``.ci/run`` installs it.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = Path(os.environ.get("LOGPROB_DRIFT_TEST_ARTIFACTS", ROOT / "runs" / "test-artifacts"))
"""Where the screenshots are kept (``runs/`` is ignored by git)."""
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    explicit = os.environ.get("CHROMIUM")
    if explicit:
        return explicit
    return next((found for name in CANDIDATES if (found := shutil.which(name))), None)


def require_chromium() -> str:
    found = find_chromium()
    if found is None:
        message = "chromium is not installed (apt-get install -y chromium; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}: the browser checks of the report must run in CI")
        pytest.skip(message)
    return found


@dataclass
class PageCheck:
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    plots: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    sorted_labels: list[str] = field(default_factory=list)
    screenshot: Path | None = None
    probe: Any = None
    """What the caller's ``probe`` expression returned, evaluated after the load (None
    without one)."""

    def external_requests(self, page: Path) -> list[str]:
        """Requests other than the page itself and inline ``data:`` URLs."""
        own = page.resolve().as_uri()
        return [u for u in self.requests if u != own and not u.startswith("data:")]


class _Browser:
    """One headless Chromium and one page, over ``--remote-debugging-pipe``."""

    def __init__(self, executable: str, width: int) -> None:
        self.profile = tempfile.mkdtemp(prefix="report-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        high_r, high_w = os.dup(to_browser_r), os.dup(from_browser_w)
        while high_r < 5 or high_w < 5:  # keep them clear of 3 and 4 for the dup2 below
            high_r, high_w = os.dup(high_r), os.dup(high_w)

        def pipes() -> None:
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.process = subprocess.Popen(
            [
                executable,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                "--remote-debugging-pipe",
                f"--user-data-dir={self.profile}",
                f"--window-size={width},1000",
                "about:blank",
            ],
            preexec_fn=pipes,
            close_fds=False,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for fd in (to_browser_r, from_browser_w, high_r, high_w):
            os.close(fd)
        self._buffer = b""
        self._next = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise EOFError("chromium closed the DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        document: dict[str, Any] = json.loads(message)
        return document

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 60) -> Any:
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if self.session is not None and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            answer = self._read(deadline)
            if answer.get("id") == self._next:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def wait_for(self, event: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == event for e in self.events):
            self.events.append(self._read(deadline))

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, clip: dict[str, float]) -> bytes:
        shot = self.call(
            "Page.captureScreenshot",
            {"format": "png", "clip": {**clip, "scale": 1}, "captureBeyondViewport": True},
        )
        return base64.b64decode(shot["data"])

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except (OSError, EOFError, TimeoutError, RuntimeError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        shutil.rmtree(self.profile, ignore_errors=True)


def pixel_variance(png: bytes) -> float:
    """Variance of the grey levels of a PNG (0 for a blank, single-colour region)."""
    from PIL import Image, ImageStat

    with Image.open(io.BytesIO(png)) as image:
        return float(ImageStat.Stat(image.convert("L")).var[0])


_INSPECT = """
(() => {
  const plots = [...document.querySelectorAll("figure.plot")].map((f) => {
    const svg = f.querySelector("svg");
    const box = (svg || f).getBoundingClientRect();
    return {plot: f.dataset.plot, case: f.dataset.case || null, svg: !!svg,
            drawn: svg ? svg.querySelectorAll("path, use, image, text").length : 0,
            x: box.left + window.scrollX, y: box.top + window.scrollY,
            width: box.width, height: box.height};
  });
  const rows = [...document.querySelectorAll("#case-table tbody tr")].map((r) => ({
    outcome: r.dataset.outcome, case: r.dataset.case, label: r.cells[0].textContent,
    background: getComputedStyle(r).backgroundColor}));
  return {plots, rows, height: document.documentElement.scrollHeight,
          width: document.documentElement.scrollWidth};
})()
"""

_SORT = """
(() => {
  const table = document.querySelector("#case-table");
  const th = [...table.tHead.rows[0].cells].find((c) => c.textContent === "max |diff|");
  th.click();
  return [...table.tBodies[0].rows].map((r) => r.cells[0].textContent);
})()
"""


def open_page(
    page: Path, screenshot_name: str, *, width: int = 1400, probe: str | None = None
) -> PageCheck:
    """Load ``page`` from disk in headless Chromium and collect what the tests assert
    (``probe``: a JavaScript expression evaluated once the page has loaded, before anything
    is clicked; its JSON value is ``PageCheck.probe``)."""
    executable = require_chromium()
    browser = _Browser(executable, width)
    check = PageCheck()
    try:
        target = browser.call("Target.createTarget", {"url": "about:blank"})
        browser.session = browser.call(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )["sessionId"]
        for domain in ("Page", "Runtime", "Network", "Log"):
            browser.call(f"{domain}.enable")
        browser.call("Page.navigate", {"url": page.resolve().as_uri()})
        browser.wait_for("Page.loadEventFired")
        time.sleep(0.3)  # late console messages
        if probe is not None:
            check.probe = browser.evaluate(probe)
        layout = browser.evaluate(_INSPECT)
        for plot in layout["plots"]:
            region = {k: plot[k] for k in ("x", "y", "width", "height")}
            plot["variance"] = (
                pixel_variance(browser.screenshot(region))
                if plot["width"] >= 1 and plot["height"] >= 1
                else 0.0
            )
            check.plots.append(plot)
        check.rows = layout["rows"]
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        check.screenshot = SCREENSHOTS / screenshot_name
        check.screenshot.write_bytes(
            browser.screenshot(
                {"x": 0, "y": 0, "width": layout["width"], "height": layout["height"]}
            )
        )
        check.sorted_labels = browser.evaluate(_SORT)
        time.sleep(0.1)
        browser.evaluate("0")  # drain events raised by the click
    finally:
        browser.close()
    for event in browser.events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            check.console_errors.append(json.dumps(params.get("args")))
        elif method == "Runtime.exceptionThrown":
            check.console_errors.append(json.dumps(params.get("exceptionDetails")))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            check.console_errors.append(str(params["entry"].get("text")))
        elif method == "Network.requestWillBeSent":
            check.requests.append(str(params.get("request", {}).get("url")))
    print(f"report screenshot: {check.screenshot}")
    return check


class LivePage:
    """A loaded page at a fixed viewport that a test drives: scripts, real mouse moves and
    key presses (DevTools ``Input``), and the console errors seen so far."""

    def __init__(self, browser: _Browser) -> None:
        self._browser = browser

    def evaluate(self, expression: str) -> Any:
        return self._browser.evaluate(expression)

    def wait_until(self, expression: str, timeout: float = 20.0) -> Any:
        """Poll ``expression`` until it is truthy (its value), failing after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"never true: {expression}")
            time.sleep(0.05)

    def draw_tokens(self) -> int:
        """Bring every per-sample token view into the window in turn (each is drawn when it
        comes near it) and wait until it is drawn; the number of views."""
        count: int = self.evaluate("document.querySelectorAll('div.tokens[data-case]').length")
        for i in range(count):
            box = f"document.querySelectorAll('div.tokens[data-case]')[{i}]"
            self.evaluate(f"{box}.scrollIntoView()")
            self.wait_until(f"{box}.dataset.drawn === '1'")
        self.evaluate("window.scrollTo(0, 0)")
        return count

    def hover(self, x: float, y: float) -> None:
        """Move the mouse to viewport coordinates ``(x, y)``."""
        self._browser.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})

    def press(self, key: str, code: str, key_code: int) -> None:
        """Press and release one key (``"Tab", "Tab", 9``; ``"ArrowRight", "ArrowRight", 39``)."""
        for kind in ("keyDown", "keyUp"):
            self._browser.call(
                "Input.dispatchKeyEvent",
                {"type": kind, "key": key, "code": code, "windowsVirtualKeyCode": key_code},
            )

    def console_errors(self) -> list[str]:
        self._browser.evaluate("0")  # drain pending events
        errors = []
        for event in self._browser.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append(json.dumps(params.get("args")))
            elif method == "Runtime.exceptionThrown":
                errors.append(json.dumps(params.get("exceptionDetails")))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                errors.append(str(params["entry"].get("text")))
        return errors

    def viewport_png(self, width: int, height: int) -> bytes:
        """The top ``width`` x ``height`` CSS pixels of the page, as PNG bytes."""
        return self._browser.screenshot({"x": 0, "y": 0, "width": width, "height": height})

    def screenshot(self, name: str) -> Path:
        """The whole page as a PNG kept under ``SCREENSHOTS``."""
        size = self.evaluate(
            "[document.documentElement.scrollWidth, document.documentElement.scrollHeight]"
        )
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / name
        path.write_bytes(
            self._browser.screenshot({"x": 0, "y": 0, "width": size[0], "height": size[1]})
        )
        return path


@contextmanager
def live_page(page: Path, *, width: int = 1280, height: int = 800) -> Iterator[LivePage]:
    """``page`` loaded from disk in headless Chromium with a ``width`` x ``height`` viewport
    (CSS pixels), for a test to drive; the browser is closed afterwards."""
    executable = require_chromium()
    browser = _Browser(executable, width)
    try:
        target = browser.call("Target.createTarget", {"url": "about:blank"})
        browser.session = browser.call(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            browser.call(f"{domain}.enable")
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        browser.call("Page.navigate", {"url": page.resolve().as_uri()})
        browser.wait_for("Page.loadEventFired")
        yield LivePage(browser)
    finally:
        browser.close()
