"""The ModelCatalog's registry clients against a real OCI registry (Debian's docker-registry, artifacts
pushed through the OCI API by the test) and local Hugging Face / Ollama servers (documented shapes).

What each test proves:

- basic auth + pagination: htpasswd users; with ``n=2`` the catalog and the tag list take several
  pages, each followed through the registry's ``Link`` header (the requests carry ``last=``); sizes,
  formats (annotation, media type, layer title) and ``oci://`` references come from the manifests;
  repositories outside the prefix are left out; no or wrong credentials -> ``Unauthorized``;
- ECR's flow: a Secret's ``ECR_AUTHORIZATION_TOKEN`` (``base64("AWS:<password>")``, what
  ``GetAuthorizationToken`` returns) is basic auth as user ``AWS`` (a registry with that htpasswd
  user: the real ECR cannot be reached from here);
- token auth: the registry's ``auth: token`` with a test certificate; the client follows the
  ``Bearer realm=...,service=...,scope=...`` challenge to the test's token endpoint (basic auth
  there), for ``registry:catalog:*`` and ``repository:<name>:pull``; a wrong password -> ``Unauthorized``;
- an OCI index is read through its manifest;
- the Hub: ``HF_TOKEN`` as Bearer, ``filter``/``search``/``author`` sent, pages followed through ``Link``;
- Ollama: ``/api/tags`` -> ``ollama://`` references with size and format.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from flexinfer.api.catalog import CatalogRegistry
from flexinfer.operator.catalog import credentials
from flexinfer.operator.registries import Credentials, RegistryError, RegistryHTTP, hub, oci
from tests.oci_registry import DOCKER_REGISTRY, OPENSSL, OCIRegistry, TokenServer
from tests.operator.hub_servers import HubServer, OllamaServer, hf_model, ollama_model

needs_registry = pytest.mark.skipif(DOCKER_REGISTRY is None,
                                    reason="docker-registry is not installed (make docker-registry: apt)")
USERS = {"alice": "s3cret", "AWS": "ecr-password-from-GetAuthorizationToken"}
GGUF = "application/vnd.ollama.image.model"


@pytest_asyncio.fixture(name="session")
async def session_fixture() -> AsyncIterator[tuple[aiohttp.ClientSession, list[str]]]:
    urls: list[str] = []
    trace = aiohttp.TraceConfig()

    async def on_start(_s: Any, _c: Any, params: aiohttp.TraceRequestStartParams) -> None:
        urls.append(str(params.url))

    trace.on_request_start.append(on_start)
    async with aiohttp.ClientSession(trace_configs=[trace], timeout=aiohttp.ClientTimeout(total=10)) as s:
        yield s, urls


async def _fill(reg: OCIRegistry, user: str | None) -> None:
    await reg.push("models/llama-3-instruct", "q4", [(b"w" * 1000, GGUF, {})], user=user)
    await reg.push("models/llama-3-instruct", "q8", [(b"w" * 2000, GGUF, {})], user=user)
    await reg.push("models/llama-3-instruct", "f16", [(b"w" * 3000, "application/octet-stream",
                                                       {"org.opencontainers.image.title": "model-f16.gguf"})],
                   user=user)
    await reg.push("models/qwen-chat", "v1", [(b"s" * 500, "application/octet-stream", {}),
                                              (b"t" * 20, "application/octet-stream", {})],
                   annotations={"ai.flexinfer.model.format": "safetensors", "ai.flexinfer.model.tags": "chat, small"},
                   user=user)
    await reg.push("models/zeta", "latest", [(b"z" * 10, GGUF, {})], user=user)
    await reg.push("other/notmine", "v1", [(b"x", GGUF, {})], user=user)


@needs_registry
async def test_oci_basic_auth_pagination_and_ecr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 session: tuple[aiohttp.ClientSession, list[str]]) -> None:
    s, urls = session
    reg = OCIRegistry(tmp_path, auth="htpasswd", users=USERS).start()
    try:
        await _fill(reg, "alice")
        monkeypatch.setattr(oci, "PAGE", 2)
        http = RegistryHTTP(s, Credentials("alice", "s3cret"), what="test")
        found, truncated = await oci.list_oci(http, f"{reg.url}/models", want=lambda n: True, limit=100)
        assert not truncated
        by = {f.name: f for f in found}
        assert sorted(by) == ["llama-3-instruct:f16", "llama-3-instruct:q4", "llama-3-instruct:q8", "qwen-chat:v1",
                              "zeta:latest"]
        q4 = by["llama-3-instruct:q4"]
        assert (q4.size_bytes, q4.format, q4.reference) == (1000, "gguf", f"oci://{reg.host}/models/llama-3-instruct:q4")
        assert "gguf" in q4.tags and "q4" in q4.tags
        assert (by["llama-3-instruct:f16"].format, by["llama-3-instruct:f16"].size_bytes) == ("gguf", 3000)
        qw = by["qwen-chat:v1"]
        assert (qw.format, qw.size_bytes) == ("safetensors", 520) and {"chat", "small", "safetensors"} <= qw.tags
        # several pages of the catalog (4 repositories, n=2), each from the registry's Link header
        # (distribution 2.8 ignores n= on tags/list: test_oci_tag_pages covers paginated tag lists)
        assert [u for u in urls if "/v2/_catalog" in u and "last=" in u]  # models/zeta is on page 2
        # the name filter is applied before manifests are fetched
        urls.clear()
        found, _ = await oci.list_oci(http, f"{reg.url}/models", want=lambda n: n.startswith("zeta"), limit=100)
        assert [f.name for f in found] == ["zeta:latest"]
        assert [u for u in urls if "/manifests/" in u] == [f"{reg.url}/v2/models/zeta/manifests/latest"]
        # limit: manifests read are bounded, the rest is reported as truncated
        found, truncated = await oci.list_oci(http, f"{reg.url}/models", want=lambda n: True, limit=2)
        assert len(found) == 2 and truncated

        # ECR: the Secret carries GetAuthorizationToken's authorizationToken = base64("AWS:<password>")
        ecr = base64.b64encode(f"AWS:{USERS['AWS']}".encode()).decode()
        secret = {"data": {"ECR_AUTHORIZATION_TOKEN": base64.b64encode(ecr.encode()).decode()}}
        creds = credentials(CatalogRegistry("OCI", f"{reg.url}/models", "ecr"), secret)
        assert (creds.username, creds.password) == ("AWS", USERS["AWS"])
        found, _ = await oci.list_oci(RegistryHTTP(s, creds), f"{reg.url}/models", want=lambda n: True, limit=100)
        assert len(found) == 5
        # a dockerconfigjson Secret for this host
        cfg = {"auths": {reg.host: {"auth": base64.b64encode(b"alice:s3cret").decode()}}}
        secret = {"data": {".dockerconfigjson": base64.b64encode(json.dumps(cfg).encode()).decode()}}
        creds = credentials(CatalogRegistry("OCI", f"{reg.url}/models", "pull"), secret)
        assert creds.basic == Credentials("alice", "s3cret").basic

        for bad in (Credentials(), Credentials("alice", "wrong")):
            with pytest.raises(RegistryError) as ei:
                await oci.list_oci(RegistryHTTP(s, bad), f"{reg.url}/models", want=lambda n: True, limit=100)
            assert ei.value.reason == "Unauthorized"
    finally:
        reg.stop()


@needs_registry
@pytest.mark.skipif(OPENSSL is None, reason="openssl is needed to sign the test tokens")
async def test_oci_token_auth(tmp_path: Path, session: tuple[aiohttp.ClientSession, list[str]]) -> None:
    s, _urls = session
    ts = await TokenServer(tmp_path, USERS, service="flexinfer-test-registry", issuer="flexinfer-test").start()
    reg = OCIRegistry(tmp_path / "reg", auth="token", users=USERS, token_server=ts).start()
    try:
        await reg.push("models/llama-3-instruct", "q4", [(b"w" * 1000, GGUF, {})], user="alice")
        await reg.push("models/indexed", "v1", [(b"i" * 64, GGUF, {})], user="alice", index=True,
                       annotations={"ai.flexinfer.model.tags": "indexed"})
        ts.requests.clear()
        http = RegistryHTTP(s, Credentials("alice", "s3cret"))
        found, _ = await oci.list_oci(http, f"{reg.url}/models", want=lambda n: True, limit=100)
        by = {f.name: f for f in found}
        assert sorted(by) == ["indexed:v1", "llama-3-instruct:q4"]
        assert (by["indexed:v1"].size_bytes, by["indexed:v1"].format) == (64, "gguf")
        assert "indexed" in by["indexed:v1"].tags
        scopes = {sc for r in ts.requests for sc in r["scopes"]}
        assert {"registry:catalog:*", "repository:models/llama-3-instruct:pull"} <= scopes
        assert all(r["user"] == "alice" and r["service"] == "flexinfer-test-registry" for r in ts.requests)
        # one token per scope: a second listing of the same client asks the token endpoint nothing new
        n = len(ts.requests)
        await oci.list_oci(http, f"{reg.url}/models", want=lambda n: True, limit=100)
        assert len(ts.requests) == n
        with pytest.raises(RegistryError) as ei:
            await oci.list_oci(RegistryHTTP(s, Credentials("alice", "nope")), f"{reg.url}/models",
                               want=lambda n: True, limit=100)
        assert ei.value.reason == "Unauthorized"
    finally:
        reg.stop()
        await ts.stop()


async def test_oci_tag_pages(session: tuple[aiohttp.ClientSession, list[str]]) -> None:
    """Tag lists paginated as the distribution spec says (``n``, ``last``, ``Link``; distribution 3
    does it, Debian's 2.8 answers one page): a local server, since the real registry here cannot."""
    import aiohttp.web

    from tests.harness import free_port

    s, urls = session
    tags = [f"t{i}" for i in range(5)]

    async def tag_list(request: aiohttp.web.Request) -> aiohttp.web.Response:
        n, last = int(request.query.get("n", "100")), request.query.get("last")
        rest = [t for t in tags if last is None or t > last]
        headers = {"Link": f'</v2/m/x/tags/list?n={n}&last={rest[n - 1]}>; rel="next"'} if len(rest) > n else {}
        return aiohttp.web.json_response({"name": "m/x", "tags": rest[:n]}, headers=headers)

    async def manifest(request: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.json_response({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                                          "layers": [{"mediaType": GGUF, "size": 7, "digest": "sha256:0"}]},
                                         content_type="application/vnd.oci.image.manifest.v1+json")

    async def catalog(request: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.json_response({"errors": [{"code": "UNSUPPORTED", "message": "no catalog"}]}, status=404)

    app = aiohttp.web.Application()
    app.router.add_get("/v2/m/x/tags/list", tag_list)
    app.router.add_get("/v2/m/x/manifests/{ref}", manifest)
    app.router.add_get("/v2/_catalog", catalog)
    runner = aiohttp.web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await aiohttp.web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        old = oci.PAGE
        oci.PAGE = 2
        try:
            # no catalog (as GHCR): the prefix is the repository
            found, _ = await oci.list_oci(RegistryHTTP(s), f"http://127.0.0.1:{port}/m/x", want=lambda n: True,
                                          limit=100)
        finally:
            oci.PAGE = old
        assert sorted(f.name for f in found) == [f"x:{t}" for t in tags]
        assert len([u for u in urls if "/tags/list" in u]) == 3
    finally:
        await runner.cleanup()


async def test_hub_models_api(monkeypatch: pytest.MonkeyPatch, session: tuple[aiohttp.ClientSession, list[str]]) -> None:
    s, _ = session
    models = [hf_model(f"org/m{i}-Instruct-GGUF", ["gguf", "text-generation"], ["m.Q4_K_M.gguf"], gguf=True)
              for i in range(5)]
    models += [hf_model("org/plain", ["safetensors"], ["model.safetensors"]), hf_model("other/x-instruct", ["gguf"])]
    srv = await HubServer(models, token="hf_secret").start()
    try:
        monkeypatch.setattr(hub, "HF_PAGE", 2)
        secret = {"data": {"HF_TOKEN": base64.b64encode(b"hf_secret").decode()}}
        creds = credentials(CatalogRegistry("HuggingFace", None, "hf-token"), secret)
        http = RegistryHTTP(s, creds)
        found, truncated = await hub.list_hf(http, f"{srv.url}/org", want=lambda n: "instruct" in n.lower(),
                                             tags=["gguf"], pattern="*instruct*", limit=100)
        assert not truncated
        assert [f.name for f in found] == [f"org/m{i}-Instruct-GGUF" for i in range(5)]
        assert found[0].reference == "HF://org/m0-Instruct-GGUF" and found[0].format == "gguf"
        assert len(srv.requests) == 3  # 5 models, 2 a page: the Link header was followed twice
        q = dict(srv.requests[0]["query"])
        assert (q["author"], q["search"], q["filter"], q["full"]) == ("org", "instruct", "gguf", "true")
        assert all(r["authorization"] == "Bearer hf_secret" for r in srv.requests)
        found, truncated = await hub.list_hf(http, f"{srv.url}/org", want=lambda n: True, tags=[], pattern=None,
                                             limit=3)
        assert len(found) == 3 and truncated
        with pytest.raises(RegistryError) as ei:
            await hub.list_hf(RegistryHTTP(s), srv.url, want=lambda n: True, tags=[], pattern=None, limit=10)
        assert ei.value.reason == "Unauthorized"
    finally:
        await srv.stop()


async def test_ollama_tags(session: tuple[aiohttp.ClientSession, list[str]]) -> None:
    s, _ = session
    srv = await OllamaServer([ollama_model("llama3.2:3b-instruct-q4_K_M", 2019393189),
                              ollama_model("gemma3:4b", 3338801804, family="gemma")]).start()
    try:
        found, truncated = await hub.list_ollama(RegistryHTTP(s), srv.url, want=lambda n: True, limit=10)
        assert not truncated
        f = found[0]
        assert (f.name, f.reference, f.size_bytes, f.format) == (
            "llama3.2:3b-instruct-q4_K_M", "ollama://llama3.2:3b-instruct-q4_K_M", 2019393189, "gguf")
        assert {"gguf", "llama", "Q4_K_M"} <= f.tags
    finally:
        await srv.stop()


async def test_unreachable_and_bad_answers(session: tuple[aiohttp.ClientSession, list[str]]) -> None:
    from tests.harness import free_port

    s, _ = session
    with pytest.raises(RegistryError) as ei:
        await oci.list_oci(RegistryHTTP(s), f"http://127.0.0.1:{free_port()}/models", want=lambda n: True, limit=5)
    assert ei.value.reason == "Unreachable"
    srv = await HubServer([]).start()  # answers 404 on /api/tags, a list on /api/models
    try:
        with pytest.raises(RegistryError) as ei:
            await hub.list_ollama(RegistryHTTP(s), srv.url, want=lambda n: True, limit=5)
        assert ei.value.reason == "NotFound"
    finally:
        await srv.stop()
