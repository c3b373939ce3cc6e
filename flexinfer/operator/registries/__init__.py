"""Registry clients of the ModelCatalog controller: what they return, how they fail, their HTTP core.

Owns: ``Found`` (one model a registry lists), ``RegistryError`` (a CamelCase reason and a message:
what the catalog's condition says), ``Credentials`` (what a Secret provides: basic auth, a bearer
token, or ECR's authorization token) and ``RegistryHTTP``: GET with JSON decoding, ``Link: <...>;
rel="next"`` pagination, and the auth dance registries do (401 + ``WWW-Authenticate: Bearer
realm=...,service=...,scope=...`` -> token endpoint -> retry; 401 + ``Basic`` -> basic credentials).
Built on aiohttp (a dependency of kopf, already used by the operator): TLS, a connection pool and
``Link`` parsing come with it.

Must not: know Kubernetes objects (the controller reads the Secret and passes ``Credentials``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from yarl import URL


@dataclass(frozen=True, slots=True)
class Found:
    """One model a registry lists (before the catalog's filter)."""

    name: str
    reference: str  # a source URI: HF://org/model, ollama://name:tag, oci://host/repo:tag
    size_bytes: int | None = None
    format: str | None = None  # gguf | safetensors | ... when the registry says
    tags: frozenset[str] = frozenset()


class RegistryError(Exception):
    """A registry could not be listed: ``reason`` (CamelCase) and ``message`` go into a condition."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a Secret provides for one registry (all optional)."""

    username: str | None = None
    password: str | None = None
    token: str | None = None  # a bearer token sent as is (HF_TOKEN; an OCI registry token)

    @property
    def basic(self) -> str | None:
        if self.username is None or self.password is None:
            return None
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()

    @classmethod
    def from_auth(cls, auth: str) -> Credentials:
        """From ``base64(user:password)``: a dockerconfigjson ``auth`` field, or ECR's
        ``GetAuthorizationToken`` ``authorizationToken`` (``base64("AWS:<password>")``)."""
        try:
            user, sep, pw = base64.b64decode(auth.strip(), validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError) as e:
            raise RegistryError("InvalidCredentials", "the auth value is not base64(user:password)") from e
        if not sep:
            raise RegistryError("InvalidCredentials", "the auth value is not base64(user:password)")
        return cls(username=user, password=pw)


_PARAM = re.compile(r'(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))')


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """``Bearer realm="https://x/token",service="x",scope="repository:a:pull"`` -> ("bearer", {...})."""
    scheme, _, rest = header.strip().partition(" ")
    params = {m.group(1).lower(): m.group(2) if m.group(2) is not None else m.group(3)
              for m in _PARAM.finditer(rest)}
    return scheme.lower(), params


@dataclass
class Page:
    status: int
    body: Any
    headers: Mapping[str, str]
    next_url: URL | None


@dataclass
class RegistryHTTP:
    """One sync's HTTP client for one registry: JSON GETs, auth, pagination, a concurrency bound."""

    session: aiohttp.ClientSession
    creds: Credentials = field(default_factory=Credentials)
    what: str = "registry"  # names the registry in error messages
    concurrency: int = 8
    max_body: int = 16 * 2**20
    _tokens: dict[str, str] = field(default_factory=dict)  # scope -> bearer token
    _sem: asyncio.Semaphore | None = None
    _basic: bool = False  # the registry asked for basic auth once: send it from then on

    def _auth_for(self, scope: str | None) -> str | None:
        if self._basic and self.creds.basic:
            return self.creds.basic
        if scope is not None and scope in self._tokens:
            return "Bearer " + self._tokens[scope]
        if self.creds.token and scope is None:
            return "Bearer " + self.creds.token
        return None

    async def get(self, url: URL | str, *, accept: str = "application/json", scope: str | None = None,
                  ok: tuple[int, ...] = (200,)) -> Page:
        """GET ``url``; answers with a status in ``ok`` are returned, others raise ``RegistryError``."""
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.concurrency)
        async with self._sem:
            url = URL(str(url))
            status, body, headers, nxt = await self._once(url, accept, self._auth_for(scope))
            if status == 401:
                challenge = headers.get("WWW-Authenticate", "")
                scheme, params = parse_challenge(challenge)
                auth: str | None = None
                if scheme == "bearer" and params.get("realm"):
                    token = await self._token(params, scope)
                    self._tokens[scope or params.get("scope", "")] = token
                    auth = "Bearer " + token
                elif scheme == "basic" and self.creds.basic:
                    auth, self._basic = self.creds.basic, True
                elif scheme == "bearer" and self.creds.token:
                    auth = "Bearer " + self.creds.token
                if auth is not None:
                    status, body, headers, nxt = await self._once(url, accept, auth)
            if status in ok:
                return Page(status, body, headers, nxt)
            raise _status_error(status, body, f"{self.what}: GET {url.path}")

    async def _once(self, url: URL, accept: str, auth: str | None) -> tuple[int, Any, Mapping[str, str], URL | None]:
        headers = {"Accept": accept, "User-Agent": "flexinfer-catalog"}
        if auth:
            headers["Authorization"] = auth
        try:
            async with self.session.get(url, headers=headers, allow_redirects=True) as r:
                raw = await r.content.read(self.max_body + 1)
                if len(raw) > self.max_body:
                    raise RegistryError("BadResponse", f"{self.what}: {url.path} answered more than "
                                                       f"{self.max_body} bytes")
                body: Any = raw
                ctype = r.headers.get("Content-Type", "")
                if raw and ("json" in ctype or raw[:1] in (b"{", b"[")):
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        if r.status == 200:
                            raise RegistryError("BadResponse", f"{self.what}: {url.path} is not JSON") from None
                nxt = r.links.get("next")
                next_url = r.url.join(URL(str(nxt["url"]))) if nxt and nxt.get("url") else None
                return r.status, body, r.headers, next_url
        except TimeoutError as e:
            raise RegistryError("Timeout", f"{self.what}: {url.host} did not answer in time") from e
        except aiohttp.ClientResponseError as e:
            raise RegistryError("BadResponse", f"{self.what}: {e.message}") from e
        except (aiohttp.ClientError, OSError) as e:
            raise RegistryError("Unreachable", f"{self.what}: {type(e).__name__}: {e}") from e

    async def _token(self, params: Mapping[str, str], scope: str | None) -> str:
        """The token endpoint (Docker/OCI token auth, as Harbor, GHCR and Docker Hub do): anonymous, or
        with the basic credentials when the Secret has them."""
        query = {k: v for k, v in (("service", params.get("service")), ("scope", scope or params.get("scope")))
                 if v}
        url = URL(params["realm"]).update_query(query)
        headers = {"Accept": "application/json", "User-Agent": "flexinfer-catalog"}
        if self.creds.basic:
            headers["Authorization"] = self.creds.basic
        elif self.creds.token:
            headers["Authorization"] = "Bearer " + self.creds.token
        try:
            async with self.session.get(url, headers=headers) as r:
                data = await r.json(content_type=None) if r.status == 200 else None
                status = r.status
        except TimeoutError as e:
            raise RegistryError("Timeout", f"{self.what}: token endpoint {url.host} did not answer") from e
        except (aiohttp.ClientError, OSError, ValueError) as e:
            raise RegistryError("Unreachable", f"{self.what}: token endpoint {url.host}: {e}") from e
        if status in (401, 403):
            raise RegistryError("Unauthorized", f"{self.what}: the token endpoint refused the credentials "
                                                f"({status})")
        token = (data.get("token") or data.get("access_token")) if isinstance(data, dict) else None
        if status != 200 or not isinstance(token, str):
            raise RegistryError("BadResponse", f"{self.what}: the token endpoint answered {status} without a token")
        return token


def _status_error(status: int, body: Any, what: str) -> RegistryError:
    detail = ""
    if isinstance(body, dict) and isinstance(body.get("errors"), list) and body["errors"]:
        e0 = body["errors"][0]
        if isinstance(e0, dict):
            detail = f" ({e0.get('code')}: {e0.get('message')})"
    reason = {401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 429: "RateLimited"}.get(
        status, "RegistryError")
    return RegistryError(reason, f"{what} answered {status}{detail}")
