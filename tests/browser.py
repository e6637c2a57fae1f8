"""Headless Chromium for the browser tests, offline: only file:// pages and servers on this machine.

The tests drive Debian's ``chromium`` (``apt-get install chromium``; CI installs it in ``.ci/run``) through
Playwright's Python package with ``executable_path``: ``playwright install`` downloads a browser build from
the internet and is never used here.

* :func:`find_chromium` / :func:`skip_reason` say whether a browser can be driven (tests skip otherwise);
* :func:`offline_browser` is a context manager that launches Chromium with a fresh profile and yields an
  :class:`OfflineBrowser`: every request that is not ``file:``/``data:``/``blob:``/``about:`` or to
  127.0.0.1 / localhost / ::1 is aborted and recorded in ``blocked``; failed requests are recorded in
  ``failed``; :meth:`OfflineBrowser.screenshot` saves PNGs under ``_build/screenshots/`` (git-ignored).

Two independent barriers keep the browser offline: Playwright's request routing (which records what it
blocks) and Chromium's ``--host-resolver-rules`` (no host name other than localhost resolves, so even a
request routing does not see, such as a WebSocket, cannot leave the machine).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / "_build" / "screenshots"

CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
]
LOCAL_SCHEMES = ("file", "data", "blob", "about", "chrome-error")
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome executable (``$MPT_LAB_CHROMIUM`` first), or None."""
    env = os.environ.get("MPT_LAB_CHROMIUM")
    for p in ((env,) if env else ()) + CHROMIUM_PATHS + tuple(filter(None, [shutil.which("chromium")])):
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def skip_reason() -> str | None:
    """Why browser tests cannot run here (None when they can)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -r requirements.txt)"
    if find_chromium() is None:
        return (
            "no Chromium found at "
            + ", ".join(CHROMIUM_PATHS)
            + " (apt-get install chromium; .ci/run does it) or $MPT_LAB_CHROMIUM"
        )
    return None


def is_local(url: str) -> bool:
    """Whether a request URL stays on this machine (file:// and friends, or the loopback interface)."""
    parts = urlsplit(url)
    if parts.scheme in LOCAL_SCHEMES:
        return True
    return parts.scheme in ("http", "https", "ws", "wss") and (parts.hostname or "") in LOCAL_HOSTS


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OfflineBrowser:
    """A launched browser context with offline routing.  Attributes: ``context`` (Playwright
    BrowserContext), ``blocked`` (URLs aborted because they would leave the machine), ``failed``
    (``(url, error)`` of requests that failed, blocked ones included), ``console`` (console messages of
    type error, and page errors)."""

    def __init__(self, context):
        self.context = context
        self.blocked: list[str] = []
        self.failed: list[tuple[str, str]] = []
        self.console: list[str] = []
        context.route("**/*", self._route)
        context.on("requestfailed", lambda r: self.failed.append((r.url, str(r.failure))))
        context.on("page", self._watch)
        for p in context.pages:
            self._watch(p)

    def _route(self, route):
        url = route.request.url
        if is_local(url):
            route.continue_()
        else:
            self.blocked.append(url)
            route.abort("blockedbyclient")

    def _watch(self, page):
        page.on("console", lambda m: self.console.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))

    def new_page(self, width: int = 1200, height: int = 900):
        page = (
            self.context.pages[0]
            if self.context.pages and self.context.pages[0].url == "about:blank"
            else self.context.new_page()
        )
        page.set_viewport_size({"width": width, "height": height})
        return page

    @staticmethod
    def screenshot(page, name: str, **kwargs) -> Path:
        """Save a PNG of ``page`` as ``_build/screenshots/NAME.png`` and return its path."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), **kwargs)
        return path


@contextlib.contextmanager
def offline_browser(timeout_ms: int = 30_000):
    """Launch headless Chromium (fresh user-data dir, offline routing); yield an :class:`OfflineBrowser`.

    Raises RuntimeError when no browser can be driven: call :func:`skip_reason` first in tests.
    """
    reason = skip_reason()
    if reason:
        raise RuntimeError(reason)
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="mpt-chromium-")
    t0 = time.perf_counter()
    try:
        with sync_playwright() as pw:
            ctx = pw.chromium.launch_persistent_context(
                profile,
                executable_path=find_chromium(),
                headless=True,
                args=LAUNCH_ARGS,
                service_workers="block",
                timeout=timeout_ms,
            )
            ctx.set_default_timeout(timeout_ms)
            try:
                ob = OfflineBrowser(ctx)
                ob.launch_seconds = time.perf_counter() - t0
                yield ob
            finally:
                ctx.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
