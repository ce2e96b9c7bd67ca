"""The pages sessiongen writes, opened in a real browser: headless Chromium (Debian's
``chromium`` package; ``make browser`` installs it), driven over the DevTools protocol on a
websocket with aiohttp, so nothing is downloaded at test time.

Each page (a plan's ``report.html``, a replay's ``report.html``, the notebook's HTML, the
built docs site's home and Benchmarks pages) is loaded at a fixed 1280x800 window and must
show every image (no ``<img>`` left broken), log no console error or uncaught exception,
and, for a plan's or a replay's report, show its decision on the first screen. A
screenshot of each page is kept under ``test-artifacts/browser/`` (git ignores it).

Without chromium the test skips, saying so, except in CI (``CI`` set), where it fails.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.support.paths import ROOT
from tests.support.synthetic import SyntheticSpec, write_run

ARTIFACTS = ROOT / "test-artifacts" / "browser"
WIDTH, HEIGHT = 1280, 800
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _chromium() -> str:
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("CI"):
        pytest.fail("chromium not found in CI: `make browser` installs Debian's package")
    pytest.skip("chromium not found (`make browser` or `apt-get install -y chromium`)")


@dataclass
class Seen:
    """What the browser said about one page."""

    errors: list[str] = field(default_factory=list)
    broken_images: list[str] = field(default_factory=list)
    images: int = 0
    decision_top: float | None = None


class DevTools:
    """The few DevTools protocol calls the test needs, on one page's session."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.next_id = 0
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self.pending:
                self.pending.pop(data["id"]).set_result(data)
            else:
                self.events.put_nowait(data)

    async def call(self, method: str, session: str | None = None, **params: Any) -> Any:
        self.next_id += 1
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[self.next_id] = future
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        await self.ws.send_str(json.dumps(message))
        reply = await asyncio.wait_for(future, 120)
        assert "error" not in reply, (method, reply["error"])
        return reply["result"]


@asynccontextmanager
async def browser(tmp: Path) -> AsyncIterator[DevTools]:
    """Headless Chromium on a port of its choosing (read back from DevToolsActivePort)."""
    profile = tmp / "chromium-profile"
    profile.mkdir()
    args = [
        _chromium(), "--headless=new", "--disable-gpu", "--no-first-run",
        "--no-default-browser-check", "--disable-extensions", "--disable-dev-shm-usage",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}", "about:blank",
    ]  # fmt: skip
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.insert(1, "--no-sandbox")  # root (CI): Chromium refuses its sandbox there
    log = (tmp / "chromium.log").open("wb")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        port_file = profile / "DevToolsActivePort"
        while not port_file.exists() or len(port_file.read_text().split()) < 2:
            assert proc.poll() is None, (tmp / "chromium.log").read_text(errors="replace")
            await asyncio.sleep(0.1)
        port, path = port_file.read_text().split()[:2]
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(f"ws://127.0.0.1:{port}{path}", max_msg_size=0) as ws,
        ):
            tools = DevTools(ws)
            try:
                yield tools
            finally:
                tools.reader.cancel()
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


CHECK_IMAGES = """JSON.stringify(Array.from(document.images).map(i => ({
    src: (i.currentSrc || i.src).slice(0, 80), ok: i.complete && i.naturalWidth > 0})))"""
DECISION_TOP = """(() => {
    const h = Array.from(document.querySelectorAll('h1, h2, h3'))
        .find(e => /^Decision/.test(e.textContent.trim()));
    return h ? h.getBoundingClientRect().top : null; })()"""


async def open_page(tools: DevTools, url: str, name: str) -> Seen:
    """Load ``url`` in a new tab, wait for its load event, and read what it shows."""
    target = await tools.call("Target.createTarget", url="about:blank")
    session = (
        await tools.call("Target.attachToTarget", targetId=target["targetId"], flatten=True)
    )["sessionId"]
    for domain in ("Page", "Runtime", "Log"):
        await tools.call(f"{domain}.enable", session)
    await tools.call(
        "Emulation.setDeviceMetricsOverride",
        session,
        width=WIDTH,
        height=HEIGHT,
        deviceScaleFactor=1,
        mobile=False,
    )
    while not tools.events.empty():
        tools.events.get_nowait()
    await tools.call("Page.navigate", session, url=url)
    seen = Seen()
    loaded = False
    deadline = time.monotonic() + 120
    while True:
        timeout = 0.5 if loaded else max(0.1, deadline - time.monotonic())
        try:
            event = await asyncio.wait_for(tools.events.get(), timeout)
        except TimeoutError:
            assert loaded, f"{name}: no load event in 120 s"
            break  # loaded, and quiet for half a second
        if event.get("sessionId") != session:
            continue
        method, params = event.get("method"), event.get("params", {})
        if method == "Page.loadEventFired":
            loaded = True
        elif method == "Runtime.exceptionThrown":
            seen.errors.append(json.dumps(params["exceptionDetails"])[:300])
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            seen.errors.append(json.dumps(params.get("args"))[:300])
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            entry = params["entry"]
            seen.errors.append(f"{entry.get('text')} {entry.get('url', '')}"[:300])

    async def evaluate(expression: str) -> Any:
        result = await tools.call(
            "Runtime.evaluate", session, expression=expression, returnByValue=True
        )
        return result["result"].get("value")

    images = json.loads(await evaluate(CHECK_IMAGES))
    seen.images = len(images)
    seen.broken_images = [i["src"] for i in images if not i["ok"]]
    seen.decision_top = await evaluate(DECISION_TOP)
    shot = await tools.call("Page.captureScreenshot", session, format="png")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"{name}.png").write_bytes(base64.b64decode(shot["data"]))
    await tools.call("Target.closeTarget", targetId=target["targetId"])
    return seen


def _plan_report(runs: Path) -> Path:
    from sessiongen.cli import main

    smoke = ROOT / "scenarios" / "smoke.toml"
    try:
        main([
            "plan", str(smoke), "--vary", "target.sim.replicas=1,2", "--seeds", "3",
            "--pays-at", "1.1", "--jobs", "1", "--no-progress", "--runs-dir", str(runs),
            "--set", "driver.concurrency=1", "--set", 'design.blocks=["off", "on"]',
        ])  # fmt: skip
    except SystemExit as exc:
        assert not exc.code, exc.code
    (folder,) = runs.glob("plan-*")
    return folder / "report" / "report.html"


def _replay_run(runs: Path) -> Path:
    return write_run(runs, SyntheticSpec(placements=("alternate", "fixed"), turns=3))


def _docs_site(out: Path) -> Path:
    built = subprocess.run(
        # not --quiet: it hides the warnings that --strict turns into a failure
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return out


async def open_clean(tmp_path: Path, pages: dict[str, str]) -> dict[str, Seen]:
    """Open each page; every one must load all its images and log no error."""
    async with browser(tmp_path) as tools:
        seen = {name: await open_page(tools, url, name) for name, url in pages.items()}
    for name, page in seen.items():
        assert page.errors == [], f"{name}: console errors {page.errors}"
        assert page.broken_images == [], f"{name}: images that did not load"
        assert (ARTIFACTS / f"{name}.png").stat().st_size > 5000, name
    return seen


def _on_first_screen(seen: Seen, name: str) -> None:
    top = seen.decision_top
    assert top is not None and 0 <= top < HEIGHT - 100, f"{name}: Decision at {top} px"


@pytest.mark.slow
async def test_plan_and_replay_reports_open_clean_with_the_decision_first(tmp_path: Path) -> None:
    _chromium()
    from sessiongen import report

    plan_html = _plan_report(tmp_path / "plan")
    replay_html = report.write_report(_replay_run(tmp_path / "runs")).parent / "report.html"
    seen = await open_clean(
        tmp_path, {"plan-report": plan_html.as_uri(), "replay-report": replay_html.as_uri()}
    )
    assert seen["plan-report"].images >= 1 and seen["replay-report"].images >= 3
    for name, page in seen.items():
        _on_first_screen(page, name)


async def test_a_broken_image_and_a_console_error_are_caught(tmp_path: Path) -> None:
    """The checks themselves: a page with both must fail them."""
    _chromium()
    planted = tmp_path / "planted.html"
    planted.write_text(
        '<html><body><h2>Decision</h2><img src="missing.png" alt="x">'
        '<script>console.error("planted")</script></body></html>'
    )
    async with browser(tmp_path) as tools:
        caught = await open_page(tools, planted.as_uri(), "planted")
    (broken,) = caught.broken_images  # its address, cut to 80 characters
    assert planted.with_name("missing.png").as_uri().startswith(broken)
    assert any("planted" in e for e in caught.errors), caught.errors
    assert caught.decision_top is not None


@pytest.mark.slow
async def test_the_notebook_html_opens_clean(tmp_path: Path) -> None:
    _chromium()
    try:
        from sessiongen.report import notebook
    except ImportError as exc:  # the [notebook] extra (dev has it)
        pytest.skip(f"no notebook extra: {exc}")
    written = notebook.run_notebook(_replay_run(tmp_path / "runs"))
    seen = await open_clean(tmp_path, {"notebook": written.as_uri()})
    assert seen["notebook"].images >= 5


@pytest.mark.slow
async def test_the_docs_site_opens_clean(tmp_path: Path) -> None:
    _chromium()
    site = _docs_site(tmp_path / "site")
    app = web.Application()
    app.router.add_static("/", site)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    try:
        seen = await open_clean(
            tmp_path,
            {
                "docs-index": f"http://127.0.0.1:{port}/index.html",
                "docs-benchmarks": f"http://127.0.0.1:{port}/benchmarks/index.html",
            },
        )
    finally:
        await runner.cleanup()
    assert seen["docs-index"].images >= 1 and seen["docs-benchmarks"].images >= 1
