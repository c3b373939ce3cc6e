"""A real OCI registry for tests: Debian's ``docker-registry`` (distribution 2.8) on a free port.

``OCIRegistry(tmp, auth=None|"htpasswd"|"token")`` writes a config (filesystem storage in ``tmp``,
``http.addr`` 127.0.0.1:<free>), starts ``docker-registry serve``, and waits for ``/v2/``:

- ``htpasswd``: users from ``users`` (bcrypt through the C library's ``crypt``, cost 4);
- ``token``: the registry trusts a test certificate (``openssl req -x509``) and sends clients to
  :class:`TokenServer`, a token endpoint of this module (aiohttp) that checks the same users with
  basic auth and signs RS256 JWTs with ``openssl dgst`` (``kid`` = the libtrust key id of the
  certificate's key, what distribution looks up in ``rootcertbundle``).

``push(...)`` uploads blobs (POST + monolithic PUT) and a manifest (PUT) through the OCI API,
authenticating as the registry asks (basic, or a Bearer challenge answered by the token endpoint).
``make test`` installs the package (``make docker-registry``: scripts/ensure-docker-registry.sh).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import aiohttp
import aiohttp.web

from tests.harness import free_port

DOCKER_REGISTRY = shutil.which("docker-registry")
OPENSSL = shutil.which("openssl")
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"


def bcrypt_line(user: str, password: str) -> str:
    """An htpasswd line (bcrypt, the only hash distribution accepts): the C library's through Python's
    ``crypt`` (< 3.13), else apache2-utils' ``htpasswd``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import crypt
    except ImportError:
        htpasswd = shutil.which("htpasswd")
        if htpasswd is None:
            import pytest

            pytest.skip("no bcrypt for the registry's htpasswd: Python's crypt (< 3.13) or apache2-utils' htpasswd")
        return subprocess.run([htpasswd, "-nbBC", "4", user, password], check=True, capture_output=True,
                              text=True).stdout.strip()
    return f"{user}:{crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))}"


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def libtrust_kid(cert: Path) -> str:
    """The key id distribution gives a certificate's public key (libtrust: base32 of the first 240
    bits of sha256 over the DER SubjectPublicKeyInfo, in groups of 4)."""
    assert OPENSSL is not None
    pub = subprocess.run([OPENSSL, "x509", "-in", str(cert), "-pubkey", "-noout"], check=True,
                         capture_output=True).stdout
    der = subprocess.run([OPENSSL, "pkey", "-pubin", "-outform", "DER"], input=pub, check=True,
                         capture_output=True).stdout
    b32 = base64.b32encode(hashlib.sha256(der).digest()[:30]).decode().rstrip("=")
    return ":".join(b32[i:i + 4] for i in range(0, len(b32), 4))


class AioServer:
    """A small aiohttp server on a free loopback port (subclasses add ``routes``); each request it
    ``record``s goes into ``requests``."""

    def __init__(self) -> None:
        self.port = free_port()
        self.requests: list[dict[str, Any]] = []
        self._runner: aiohttp.web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def routes(self, app: aiohttp.web.Application) -> None:
        raise NotImplementedError

    async def start(self) -> Self:
        app = aiohttp.web.Application()
        self.routes(app)
        self._runner = aiohttp.web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await aiohttp.web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def record(self, request: aiohttp.web.Request) -> None:
        self.requests.append({"path": request.path, "query": list(request.query.items()),
                              "authorization": request.headers.get("Authorization")})


class TokenServer(AioServer):
    """A Docker/OCI token endpoint: ``GET /token?service=&scope=...`` with basic auth -> ``{"token"}``."""

    def __init__(self, directory: Path, users: Mapping[str, str], service: str, issuer: str) -> None:
        assert OPENSSL is not None, "openssl is needed for the token server"
        self.dir, self.users, self.service, self.issuer = directory, dict(users), service, issuer
        self.key, self.cert = directory / "token.key", directory / "token.pem"
        subprocess.run([OPENSSL, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(self.key), "-out",
                        str(self.cert), "-days", "2", "-subj", "/CN=flexinfer-test-token"], check=True,
                       capture_output=True)
        self.kid = libtrust_kid(self.cert)
        super().__init__()  # requests: {"user", "scopes"} per token request

    @property
    def realm(self) -> str:
        return f"http://127.0.0.1:{self.port}/token"

    def sign(self, claims: Mapping[str, Any]) -> str:
        header = {"typ": "JWT", "alg": "RS256", "kid": self.kid}
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        assert OPENSSL is not None
        sig = subprocess.run([OPENSSL, "dgst", "-sha256", "-sign", str(self.key)], input=signing_input.encode(),
                             check=True, capture_output=True).stdout
        return f"{signing_input}.{_b64url(sig)}"

    async def _token(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        user = None
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            u, _, p = base64.b64decode(auth[6:]).decode().partition(":")
            if self.users.get(u) == p:
                user = u
        scopes = request.query.getall("scope", [])
        self.requests.append({"user": user, "scopes": scopes, "service": request.query.get("service")})
        if user is None:
            return aiohttp.web.json_response({"errors": [{"code": "UNAUTHORIZED", "message": "bad credentials"}]},
                                             status=401)
        access = []
        for s in scopes:
            typ, _, rest = s.partition(":")
            name, _, actions = rest.rpartition(":")
            access.append({"type": typ, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        claims = {"iss": self.issuer, "sub": user, "aud": self.service, "exp": now + 600, "nbf": now - 10,
                  "iat": now, "jti": uuid.uuid4().hex, "access": access}
        token = await asyncio.get_running_loop().run_in_executor(None, self.sign, claims)
        return aiohttp.web.json_response({"token": token, "access_token": token, "expires_in": 600})

    def routes(self, app: aiohttp.web.Application) -> None:
        app.router.add_get("/token", self._token)


class OCIRegistry:
    """One ``docker-registry serve`` process (see the module docstring)."""

    def __init__(self, directory: Path, *, auth: str | None = None, users: Mapping[str, str] | None = None,
                 token_server: TokenServer | None = None) -> None:
        if DOCKER_REGISTRY is None:
            raise RuntimeError("docker-registry is not installed (make docker-registry)")
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.auth, self.users = auth, dict(users or {})
        self.token_server = token_server
        self.proc: subprocess.Popen[bytes] | None = None
        lines = ["version: 0.1", "log:", "  level: error", "  accesslog:", "    disabled: true", "storage:",
                 "  filesystem:", f"    rootdirectory: {self.dir / 'data'}", "  delete:", "    enabled: true",
                 "http:", f"  addr: 127.0.0.1:{self.port}"]
        if auth == "htpasswd":
            (self.dir / "htpasswd").write_text("".join(bcrypt_line(u, p) + "\n" for u, p in self.users.items()))
            lines += ["auth:", "  htpasswd:", "    realm: flexinfer-test", f"    path: {self.dir / 'htpasswd'}"]
        elif auth == "token":
            assert token_server is not None
            lines += ["auth:", "  token:", f"    realm: {token_server.realm}", f"    service: {token_server.service}",
                      f"    issuer: {token_server.issuer}", f"    rootcertbundle: {token_server.cert}"]
        (self.dir / "config.yml").write_text("\n".join(lines) + "\n")

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    @property
    def log(self) -> str:
        p = self.dir / "registry.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def start(self, timeout: float = 15.0) -> OCIRegistry:
        assert DOCKER_REGISTRY is not None and self.proc is None
        with (self.dir / "registry.log").open("wb") as logf:
            self.proc = subprocess.Popen([DOCKER_REGISTRY, "serve", str(self.dir / "config.yml")],
                                         stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT)
        end = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/v2/", timeout=0.5):
                    return self
            except urllib.error.HTTPError:
                return self  # 401: up, with auth
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > end:
                self.stop()
                raise RuntimeError(f"docker-registry did not start on {self.host}: {self.log[-2000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    # -- pushing -----------------------------------------------------------------------------------

    async def _authed(self, session: aiohttp.ClientSession, method: str, url: str, user: str | None,
                      **kw: Any) -> aiohttp.ClientResponse:
        from flexinfer.operator.registries import Credentials, parse_challenge

        headers = dict(kw.pop("headers", {}))
        basic = Credentials(user, self.users[user]).basic if user else None
        if basic and self.auth == "htpasswd":
            headers["Authorization"] = basic
        r = await session.request(method, url, headers=headers, **kw)
        if r.status == 401 and basic and self.auth == "token":
            _, params = parse_challenge(r.headers["WWW-Authenticate"])
            r.release()
            async with session.get(params["realm"], params={"service": params["service"], "scope": params["scope"]},
                                   headers={"Authorization": basic}) as t:
                token = (await t.json())["token"]
            headers["Authorization"] = f"Bearer {token}"
            r = await session.request(method, url, headers=headers, **kw)
        return r

    async def push_blob(self, session: aiohttp.ClientSession, repo: str, data: bytes, user: str | None) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        r = await self._authed(session, "POST", f"{self.url}/v2/{repo}/blobs/uploads/", user)
        assert r.status == 202, (r.status, await r.text())
        location = r.headers["Location"]
        r.release()
        if location.startswith("/"):
            location = self.url + location
        sep = "&" if "?" in location else "?"
        r = await self._authed(session, "PUT", f"{location}{sep}digest={digest}", user, data=data,
                               headers={"Content-Type": "application/octet-stream"})
        assert r.status == 201, (r.status, await r.text())
        r.release()
        return digest

    async def push(self, repo: str, tag: str, layers: Sequence[tuple[bytes, str, Mapping[str, str]]], *,
                   annotations: Mapping[str, str] | None = None, user: str | None = None,
                   index: bool = False) -> dict[str, Any]:
        """Push an artifact: ``layers`` as (content, mediaType, annotations); returns the manifest.
        ``index``: the tag names an OCI index whose one entry is the manifest."""
        async with aiohttp.ClientSession() as s:
            config = b"{}"
            cdigest = await self.push_blob(s, repo, config, user)
            descs = []
            for data, media, ann in layers:
                d = await self.push_blob(s, repo, data, user)
                descs.append({"mediaType": media, "digest": d, "size": len(data), **({"annotations": dict(ann)}
                                                                                    if ann else {})})
            manifest: dict[str, Any] = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                                        "config": {"mediaType": OCI_CONFIG, "digest": cdigest, "size": len(config)},
                                        "layers": descs}
            if annotations and not index:
                manifest["annotations"] = dict(annotations)
            raw = json.dumps(manifest).encode()
            ref = tag if not index else "sha256:" + hashlib.sha256(raw).hexdigest()
            await self._put_manifest(s, repo, ref, raw, OCI_MANIFEST, user)
            if index:
                idx = {"schemaVersion": 2, "mediaType": OCI_INDEX,
                       "manifests": [{"mediaType": OCI_MANIFEST, "digest": ref, "size": len(raw)}],
                       **({"annotations": dict(annotations)} if annotations else {})}
                await self._put_manifest(s, repo, tag, json.dumps(idx).encode(), OCI_INDEX, user)
            return manifest

    async def _put_manifest(self, s: aiohttp.ClientSession, repo: str, ref: str, raw: bytes, media: str,
                            user: str | None) -> None:
        r = await self._authed(s, "PUT", f"{self.url}/v2/{repo}/manifests/{ref}", user, data=raw,
                               headers={"Content-Type": media})
        assert r.status == 201, (r.status, await r.text())
        r.release()
