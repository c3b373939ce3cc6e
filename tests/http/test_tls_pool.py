"""TLS upstreams in the client pool (docs/tls.md), on real sockets against the stub engine behind
ssl: verification (CA file, wrong CA, wrong name, skip-verify), keep-alive reuse of one TLS
connection, a handshake failure as a connect error, the peer pool's own Authorization and base
path, and that plain-http pools stay keyed and built as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flexinfer.http.client import Pools, UpstreamConnectError, UpstreamPool
from flexinfer.http.tls import KeyedPool
from flexinfer.runtime.base import Endpoint, UpstreamLink
from flexinfer.settings import UpstreamSettings
from tests.stub_engine import StubEngine
from tests.tls.certs import Certs, make_certs

FAST = UpstreamSettings(connect_timeout=2.0, response_timeout=5.0, stream_idle_timeout=5.0)
CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
HDRS = [(b"content-type", b"application/json"), (b"authorization", b"Bearer client-key")]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


async def _chat(pool: UpstreamPool, path: str = "/v1/chat/completions") -> tuple[int, bytes]:
    up = await pool.request("POST", path, list(HDRS), CHAT)
    try:
        return up.status, await up.read_all(1 << 20)
    finally:
        up.close()


async def test_tls_pool_reuses_one_connection(certs: Certs) -> None:
    stub = await StubEngine().start(ssl=certs.server_context())
    pools = Pools(FAST)
    try:
        ep = Endpoint.parse(f"https://127.0.0.1:{stub.port}", ca_file=str(certs.ca))
        assert ep.scheme == "https" and ep.key == f"127.0.0.1:{stub.port}"
        assert ep.link is not None
        pool = pools.get_linked(ep.host, ep.port, ep.link)
        assert pools.get_linked(ep.host, ep.port, ep.link) is pool
        assert pool is not pools.get(ep.host, ep.port)  # the plain pool of the same address is another
        for _ in range(5):
            status, body = await _chat(pool)
            assert status == 200 and b"hello from stub" in body
        assert stub.connections_total == 1  # 5 requests, 1 TLS connection (keep-alive)
        assert pool.idle == 1
        assert stub.requests[-1].headers["authorization"] == "Bearer client-key"  # no key: passed as is
        assert stub.requests[-1].headers["host"] == f"127.0.0.1:{stub.port}"
    finally:
        await pools.close_all()
        await stub.stop()


@pytest.mark.parametrize("how", ["wrong_ca", "system_ca", "wrong_name"])
async def test_handshake_failure_is_a_connect_error(certs: Certs, how: str) -> None:
    stub = await StubEngine().start(ssl=certs.server_context())
    pools = Pools(FAST)
    try:
        ca = {"wrong_ca": str(certs.other_ca), "system_ca": None, "wrong_name": str(certs.ca)}[how]
        # wrong_name: the right CA, but the certificate names 127.0.0.1 and localhost only
        link = UpstreamLink(True, "not-the-name.example" if how == "wrong_name" else "127.0.0.1", ca)
        ep = Endpoint("127.0.0.1", stub.port, link=link)
        pool = pools.get_linked(ep.host, ep.port, link)
        with pytest.raises(UpstreamConnectError) as ei:
            await _chat(pool)
        assert ei.value.reason == "tls_handshake" and not ei.value.sent
        assert "TLS handshake with https://127.0.0.1:" in str(ei.value)
        assert stub.requests == []
        assert pool.active == 0 and pool.idle == 0
    finally:
        await pools.close_all()
        await stub.stop()


async def test_insecure_skip_verify_accepts_an_unknown_ca(certs: Certs) -> None:
    stub = await StubEngine().start(ssl=certs.server_context())
    pools = Pools(FAST)
    try:
        ep = Endpoint.parse(f"https://127.0.0.1:{stub.port}", insecure_skip_verify=True)
        assert ep.link is not None
        assert (await _chat(pools.get_linked(ep.host, ep.port, ep.link)))[0] == 200
    finally:
        await pools.close_all()
        await stub.stop()


async def test_unreadable_ca_file_is_a_connect_error(tmp_path: Path) -> None:
    pools = Pools(FAST)
    ep = Endpoint.parse("https://127.0.0.1:9", ca_file=str(tmp_path / "missing.pem"))
    assert ep.link is not None
    with pytest.raises(UpstreamConnectError) as ei:
        pools.get_linked(ep.host, ep.port, ep.link)
    assert ei.value.reason == "tls_config" and "missing.pem" in str(ei.value)


async def test_keyed_pool_replaces_the_clients_authorization(certs: Certs) -> None:
    stub = await StubEngine().start(ssl=certs.server_context())
    pools = Pools(FAST)
    try:
        ep = Endpoint.parse(f"https://localhost:{stub.port}", ca_file=str(certs.ca), api_key="peer-key",
                            path_prefix="/api")
        assert ep.link is not None and "peer-key" not in repr(ep)
        pool = pools.get_linked(ep.host, ep.port, ep.link)
        assert isinstance(pool, KeyedPool)
        headers = [*HDRS, (b"proxy-authorization", b"Basic x")]
        up = await pool.request("POST", "/v1/chat/completions", headers, CHAT)
        up.close()
        seen = stub.requests[-1]
        assert seen.path == "/api/v1/chat/completions"
        assert [v for k, v in seen.raw_headers if k.lower() == b"authorization"] == [b"Bearer peer-key"]
        assert not any(k.lower() == b"proxy-authorization" for k, _ in seen.raw_headers)
        assert headers[1] == (b"authorization", b"Bearer client-key")  # the caller's list is untouched
    finally:
        await pools.close_all()
        await stub.stop()


def test_plain_endpoints_keep_the_plain_pool_path() -> None:
    ep = Endpoint.parse("http://127.0.0.1:8000")
    assert ep.link is None and ep.scheme == "http"
    assert Endpoint.parse("127.0.0.1:8000") == ep
    https = Endpoint.parse("https://example.com")
    assert (https.host, https.port, https.scheme) == ("example.com", 443, "https")
    assert https.link is not None and https.link.server_hostname == "example.com"
    assert Endpoint.parse("https://[::1]").port == 443
    with pytest.raises(ValueError, match="unsupported endpoint scheme"):
        Endpoint.parse("ftp://h:1")
    pool = UpstreamPool("example.com", 443, FAST)  # plain constructor unchanged: no TLS
    assert pool._ssl is None and pool._sni is None
