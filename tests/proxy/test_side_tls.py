"""The side channels dial a TLS or keyed endpoint the way its requests go (flexinfer.proxy.sidedial):
the engine scraper and the active health check against the stub engine behind TLS (certificates
from tests/tls/certs.py), verified with the endpoint's CA file, with a peer's API key and base
path; a wrong CA is a failed check (``connect``), never plaintext sent to a TLS port."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from flexinfer.proxy.ejection import Ejector, HealthChecker
from flexinfer.proxy.scrape import EngineScraper
from flexinfer.runtime.base import Endpoint
from tests.proxy.test_enginemetrics import vllm_v1
from tests.stub_engine import StubEngine
from tests.tls.certs import Certs, make_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
async def tls_stub(certs: Certs) -> AsyncIterator[StubEngine]:
    stub = await StubEngine().start(ssl=certs.server_context())
    stub.metrics_text = vllm_v1(waiting=4, running=3, kv=0.5)
    try:
        yield stub
    finally:
        await stub.stop()


def _ep(stub: StubEngine, ca: str, api_key: str | None = None, path_prefix: str = "") -> Endpoint:
    return Endpoint.parse(f"https://127.0.0.1:{stub.port}", ca_file=ca, api_key=api_key, path_prefix=path_prefix)


async def test_scraper_over_tls_with_the_peers_key(tls_stub: StubEngine, certs: Certs) -> None:
    ep = _ep(tls_stub, str(certs.ca), api_key="peer-key")
    s = EngineScraper(models_every=0)
    s.set_endpoints([ep.key], {ep.key: ep.link})
    st = await s.scrape(ep.key)
    assert st.error is None and st.waiting == 4 and st.running == 3, st
    (req,) = [r for r in tls_stub.requests if r.path == "/metrics"]
    assert req.headers.get("authorization") == "Bearer peer-key"
    # without the link (the old behaviour) the scraper spoke plaintext to the TLS port
    plain = EngineScraper(models_every=0)
    plain.set_endpoints([ep.key])
    assert (await plain.scrape(ep.key)).error in ("connect", "malformed")  # the TLS port's alert is no HTTP


async def test_a_wrong_ca_fails_the_scrape_and_the_check(tls_stub: StubEngine, certs: Certs) -> None:
    ep = _ep(tls_stub, str(certs.other_ca))
    s = EngineScraper(models_every=0)
    s.set_endpoints([ep.key], {ep.key: ep.link})
    assert (await s.scrape(ep.key)).error == "connect"
    hc = HealthChecker(Ejector(), timeout=2.0)
    hc.set_endpoints([ep.key], {ep.key: ep.link})
    assert await hc.check(ep.key) == "connect"
    assert tls_stub.metrics_hits == 0 and tls_stub.health_hits == 0


async def test_health_check_over_tls_under_the_base_path(tls_stub: StubEngine, certs: Certs) -> None:
    ok = _ep(tls_stub, str(certs.ca))
    hc = HealthChecker(Ejector(), timeout=2.0)
    hc.set_endpoints([ok.key], {ok.key: ok.link})
    assert await hc.check(ok.key) == "ok"
    assert tls_stub.health_hits == 1
    pre = _ep(tls_stub, str(certs.ca), path_prefix="/api", api_key="k2")
    hc.set_endpoints([pre.key], {pre.key: pre.link})
    await hc.check(pre.key)  # the stub has no /api/health: what matters is what was asked
    asked = [r for r in tls_stub.requests if r.path.startswith("/api")]
    assert [r.path for r in asked] == ["/api/health"] and asked[0].headers["authorization"] == "Bearer k2"
