"""A real headless Chromium, driven over the Chrome DevTools protocol, to open the HTML reports as a reader would."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

BINARIES = ("chromium", "chromium-browser", "google-chrome")


def find() -> str | None:
    return next((p for b in BINARIES if (p := shutil.which(b))), None)


class Chromium:
    """One headless browser with one page. `open(path)` loads a file and returns what the page showed."""

    def __init__(self, binary: str, profile: Path, width: int = 1280, height: int = 900):
        import websocket  # websocket-client, a dev dependency

        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
             "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port = self._port(profile / "DevToolsActivePort")
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        url = next(p["webSocketDebuggerUrl"] for p in pages if p.get("type") == "page")
        self.ws = websocket.create_connection(url, timeout=30)
        self._id = 0
        self.events: list[dict] = []
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def _port(self, marker: Path, timeout: float = 30) -> int:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with code {self.proc.returncode} before it listened")
            if marker.exists() and (text := marker.read_text().split()):
                return int(text[0])
            time.sleep(0.1)
        raise RuntimeError(f"chromium did not write {marker} within {timeout} s")

    def call(self, method: str, params: dict | None = None) -> dict:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params or {}}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def _wait(self, method: str, timeout: float = 30) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(e.get("method") == method for e in self.events):
                return
            self.events.append(json.loads(self.ws.recv()))
        raise RuntimeError(f"no {method} within {timeout} s")

    def open(self, path: Path) -> tuple[list[str], list[dict]]:
        """(console errors and uncaught exceptions, one dict per <img>: natural and displayed size, loaded)."""
        self.events.clear()
        self.call("Page.navigate", {"url": Path(path).resolve().as_uri()})
        self._wait("Page.loadEventFired")
        js = ("JSON.stringify([...document.images].map(i => {const r = i.getBoundingClientRect(); return "
              "{complete: i.complete, naturalWidth: i.naturalWidth, naturalHeight: i.naturalHeight, "
              "width: r.width, height: r.height, alt: i.alt}}))")
        images = json.loads(self.call("Runtime.evaluate", {"expression": js, "returnByValue": True})["result"]["value"])
        errors = []
        for e in self.events:
            p = e.get("params", {})
            if e.get("method") == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                errors.append(d.get("exception", {}).get("description") or d.get("text", "exception"))
            elif e.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif e.get("method") == "Log.entryAdded" and p["entry"].get("level") == "error":
                errors.append(p["entry"].get("text", ""))
        return errors, images

    def page_width(self) -> int:
        """The open page's width in CSS pixels, what the window scrolls over sideways where it is wider."""
        js = "document.documentElement.scrollWidth"
        return int(self.call("Runtime.evaluate", {"expression": js, "returnByValue": True})["result"]["value"])

    def close(self) -> None:
        with contextlib.suppress(Exception):  # the browser may close before it answers
            self.call("Browser.close")
        self.ws.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
