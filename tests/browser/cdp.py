"""A small driver for headless Chromium over the DevTools protocol: launch, navigate, read
the DOM with JavaScript, click with real mouse events, type, take screenshots. Enough for the
dashboard's browser tests; no Playwright or Selenium (their browser downloads are not
reachable here), only Debian's chromium (``scripts/fetch-chromium.sh``) and ``websockets``."""

from __future__ import annotations

import base64
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

ROOT = Path(__file__).resolve().parents[2]
WRAPPER = ROOT / ".servers" / "chromium" / "chromium"
#: Flags for a closed network and a root user (the machine's notes): no sandbox, no GPU, no
#: background traffic that would be refused over and over.
FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]


def chromium_binary() -> Path:
    """The unpacked Debian chromium, fetched by scripts/fetch-chromium.sh on first use."""
    if not WRAPPER.exists():
        done = subprocess.run(
            ["bash", str(ROOT / "scripts" / "fetch-chromium.sh")],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if done.returncode != 0:
            raise RuntimeError(f"scripts/fetch-chromium.sh failed:\n{done.stderr[-3000:]}")
    return WRAPPER


class Browser:
    """One headless Chromium process with one page, driven over its DevTools websocket."""

    def __init__(self, width: int = 1280, height: int = 760) -> None:
        self.profile = tempfile.mkdtemp(prefix="echomq-chromium-")
        self.proc = subprocess.Popen(
            [str(chromium_binary()), *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            self._connect(width, height)
        except BaseException:
            self.close()  # never leave a browser behind a failed start
            raise

    def _connect(self, width: int, height: int) -> None:
        port = self._devtools_port()
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list").read())
        page = next(t for t in targets if t["type"] == "page")
        # entered by hand: the connection lives as long as this object, not a with-block
        self.ws: ClientConnection = connect(page["webSocketDebuggerUrl"], max_size=None).__enter__()
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )

    def _devtools_port(self) -> int:
        assert self.proc.stderr is not None
        deadline = time.monotonic() + 30
        seen: list[str] = []
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                if self.proc.poll() is not None:
                    break
                continue
            seen.append(line)
            found = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if found:
                # keep reading what it logs, or a full pipe would stall the browser
                threading.Thread(
                    target=self._discard, args=(self.proc.stderr,), daemon=True
                ).start()
                return int(found.group(1))
        raise RuntimeError("chromium did not start:\n" + "".join(seen[-20:]))

    @staticmethod
    def _discard(stream: Any) -> None:
        try:
            for _ in stream:
                pass
        except (OSError, ValueError):  # closed by close()
            pass

    # -- protocol --------------------------------------------------------------------------
    def call(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            self.events.append(message)

    def _drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                self.events.append(json.loads(self.ws.recv(timeout=left)))
            except TimeoutError:
                return

    # -- what a test does ------------------------------------------------------------------
    def goto(self, url: str, timeout: float = 30.0) -> float:
        """Load ``url`` and wait for its load event; the seconds it took. Events still on their
        way from the page before (a live page polling a dashboard that has stopped) are
        read and dropped first, so :meth:`errors` holds this page's only."""
        self._drain(0.05)
        self.events.clear()
        started = time.monotonic()
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'", timeout=timeout)
        return time.monotonic() - started

    def js(self, expression: str) -> Any:
        reply = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in reply:
            raise RuntimeError(f"{expression}: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def text(self, selector: str) -> str:
        value = self.js(f"(document.querySelector({json.dumps(selector)}) || {{}}).textContent")
        if value is None:
            raise AssertionError(f"no element {selector!r} on {self.js('location.href')}")
        return " ".join(str(value).split())

    def wait_for(self, expression: str, timeout: float = 15.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.js(expression)
            except RuntimeError:
                value = None  # mid-navigation: the context is being replaced
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {expression}")
            time.sleep(0.05)

    def click(self, selector: str) -> None:
        """A real click: mouse pressed and released at the centre of the element's first box
        (a link that wraps onto two lines has nothing of it at its bounding box's centre)."""
        box = self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e) return null; e.scrollIntoView({block: 'center'});"
            " const r = e.getClientRects()[0] || e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        if box is None:
            raise AssertionError(f"nothing to click at {selector!r}")
        x, y = box
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def type_into(self, selector: str, text: str) -> None:
        self.click(selector)
        self.call("Input.insertText", text=text)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def errors(self) -> list[str]:
        """JavaScript exceptions and console errors (CSP violations among them) so far."""
        self._drain(0.05)
        out = []
        for event in self.events:
            if event.get("method") == "Runtime.exceptionThrown":
                out.append(str(event["params"]["exceptionDetails"].get("text")))
            elif event.get("method") == "Log.entryAdded":
                entry = event["params"]["entry"]
                if entry.get("level") == "error":
                    out.append(f"{entry.get('source')}: {entry.get('text')}")
            elif (
                event.get("method") == "Runtime.consoleAPICalled"
                and event["params"].get("type") == "error"
            ):
                out.append(str(event["params"].get("args")))
        return out

    def close(self) -> None:
        try:
            if hasattr(self, "ws"):
                self.ws.close()
        finally:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(5)
            shutil.rmtree(self.profile, ignore_errors=True)
