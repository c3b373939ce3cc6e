"""Passive outlier ejection through the real proxy: an endpoint that keeps failing leaves rotation."""

from __future__ import annotations

import asyncio

import openai

from tests.proxy.conftest import Stack, fast_settings, model


class Failing:
    """A raw HTTP server that answers every request with a 500 and counts them."""

    def __init__(self) -> None:
        self.hits = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while True:
                    head = await r.readuntil(b"\r\n\r\n")
                    n = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")), 0)
                    await r.readexactly(n)
                    self.hits += 1
                    body = b'{"error":{"message":"boom","type":"server_error"}}'
                    w.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                    await w.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                w.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


def test_five_failures_in_a_row_eject_the_endpoint(stack: Stack) -> None:
    bad = Failing()
    port = stack.run(bad.start())
    try:
        stack.start_proxy([model("m", port, stack.stub, routing="round-robin")], fast_settings())
        c = openai.OpenAI(base_url=stack.base_url, api_key="k", max_retries=0)
        codes = []
        for _ in range(30):
            try:
                c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
                codes.append(200)
            except openai.InternalServerError as e:
                codes.append(e.status_code)
        assert bad.hits == 5, bad.hits  # the 5th failure in a row ejected it: no request since
        assert codes.count(500) == 5 and codes[-20:] == [200] * 20, codes
        text = stack.call(lambda: stack.handler.metrics.render().decode())  # type: ignore[union-attr]
        assert f'flexinfer_proxy_endpoint_ejections_total{{endpoint="127.0.0.1:{port}",model="m"}} 1.0' in text
    finally:
        stack.run(bad.stop())


def test_one_endpoint_is_never_ejected(stack: Stack) -> None:
    bad = Failing()
    port = stack.run(bad.start())
    try:
        stack.start_proxy([model("m", port)], fast_settings())
        c = openai.OpenAI(base_url=stack.base_url, api_key="k", max_retries=0)
        for _ in range(8):
            try:
                c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            except openai.InternalServerError:
                pass
        assert bad.hits == 8  # the only endpoint keeps getting traffic (the engine's answer, not a 503)
    finally:
        stack.run(bad.stop())
