"""The OCI Distribution client of the ModelCatalog: repositories, tags and manifests of a registry.

Owns: ``list_oci`` — for a registry URL ``[http(s)://]host[:port][/prefix]`` (https unless told):

1. the repositories: ``GET /v2/_catalog?n=N`` (scope ``registry:catalog:*``), every page followed
   through ``Link: <...>; rel="next"``, kept when equal to the prefix or under it. A registry that
   does not offer the catalog to this client (GHCR, ECR without the permission, Docker Hub: 401, 403,
   404 or ``UNSUPPORTED``) with a prefix: the prefix is taken as one repository;
2. the tags of each: ``GET /v2/<name>/tags/list?n=N`` (scope ``repository:<name>:pull``), paginated
   the same way;
3. each tag's manifest (``Accept``: OCI image manifest and index, Docker v2 manifest and list): size
   = the sum of the layers, format and tags from annotations (``ai.flexinfer.model.format``,
   ``ai.flexinfer.model.tags`` comma separated, ``org.opencontainers.image.title`` of a layer with a
   ``.gguf`` / ``.safetensors`` name) or the layer media types (``gguf``, ``safetensors``,
   ``application/vnd.ollama.image.model`` = gguf). An index is read through its first manifest.

The name of an entry is ``<repository under the prefix>:<tag>``; its reference ``oci://host/repo:tag``
is a ModelCache ``source`` (``oras pull``). Names are filtered before any manifest is fetched, and at
most ``limit`` manifests are read per sync (the rest counts as truncated).

Must not: know Kubernetes objects or the catalog's status.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from yarl import URL

from flexinfer.operator.registries import Found, RegistryError, RegistryHTTP

PAGE = 100  # n= of catalog and tag pages
MAX_PAGES = 200  # per listing: a registry that paginates forever is cut off
MANIFEST_TYPES = ", ".join((
    "application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json"))
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
FORMAT_KEY = "ai.flexinfer.model.format"
TAGS_KEY = "ai.flexinfer.model.tags"
TITLE_KEY = "org.opencontainers.image.title"
_SUFFIX_FORMATS = ((".gguf", "gguf"), (".safetensors", "safetensors"), (".onnx", "onnx"), (".bin", "bin"))


def split_url(url: str) -> tuple[URL, str, str]:
    """``ghcr.io/org/models`` -> (``https://ghcr.io``, ``ghcr.io``, ``org/models``)."""
    raw = url.strip()
    raw = raw.removeprefix("oci://")
    if "://" not in raw:
        raw = "https://" + raw
    u = URL(raw)
    if u.scheme not in ("http", "https") or not u.host:
        raise RegistryError("InvalidURL", f"{url!r} is not host[:port][/prefix]")
    host = u.host if u.explicit_port is None else f"{u.host}:{u.explicit_port}"
    return u.with_path("/").with_query(None), host, u.path.strip("/")


async def _paged(http: RegistryHTTP, first: URL, key: str, scope: str) -> list[str]:
    out: list[str] = []
    url: URL | None = first
    for _ in range(MAX_PAGES):
        if url is None:
            break
        page = await http.get(url, scope=scope)
        items = page.body.get(key) if isinstance(page.body, dict) else None
        if items is not None and not isinstance(items, list):
            raise RegistryError("BadResponse", f"{http.what}: {first.path} has no {key} list")
        out.extend(str(i) for i in items or ())
        url = page.next_url
    return out


async def repositories(http: RegistryHTTP, base: URL, prefix: str) -> list[str]:
    try:
        repos = await _paged(http, base.with_path("/v2/_catalog").with_query(n=PAGE), "repositories",
                             "registry:catalog:*")
    except RegistryError as e:
        if prefix and e.reason in ("NotFound", "Unauthorized", "Forbidden"):
            return [prefix]  # no catalog for us: the prefix names the repository
        raise
    under = [r for r in repos if not prefix or r == prefix or r.startswith(prefix + "/")]
    return sorted(set(under))


def _entry_name(repo: str, prefix: str, tag: str) -> str:
    if prefix and repo.startswith(prefix + "/"):
        rel = repo[len(prefix) + 1:]
    elif prefix and repo == prefix:
        rel = repo.rsplit("/", 1)[-1]
    else:
        rel = repo
    return f"{rel}:{tag}"


def describe(manifest: dict[str, Any], parent_annotations: dict[str, str] | None = None) -> tuple[int | None, str | None,
                                                                                                 frozenset[str]]:
    """(size, format, tags) of an image manifest."""
    ann = {**(parent_annotations or {}), **(manifest.get("annotations") or {})}
    layers = [la for la in manifest.get("layers") or () if isinstance(la, dict)]
    sizes = [la.get("size") for la in layers]
    size = sum(int(s) for s in sizes if isinstance(s, int) and s >= 0) if layers else None
    fmt = ann.get(FORMAT_KEY)
    if not fmt:
        for la in layers:
            mt = str(la.get("mediaType") or "")
            title = str((la.get("annotations") or {}).get(TITLE_KEY) or "")
            if "gguf" in mt or mt == "application/vnd.ollama.image.model":
                fmt = "gguf"
            elif "safetensors" in mt:
                fmt = "safetensors"
            else:
                fmt = next((f for suf, f in _SUFFIX_FORMATS if title.lower().endswith(suf)), None)
            if fmt:
                break
    if not fmt:
        art = str(manifest.get("artifactType") or (manifest.get("config") or {}).get("mediaType") or "")
        fmt = next((f for f in ("gguf", "safetensors", "onnx") if f in art), None)
    tags = {t.strip() for t in str(ann.get(TAGS_KEY) or "").split(",") if t.strip()}
    if fmt:
        tags.add(fmt)
    return size, fmt or None, frozenset(tags)


async def manifest_entry(http: RegistryHTTP, base: URL, host: str, repo: str, prefix: str, tag: str) -> Found:
    scope = f"repository:{repo}:pull"
    page = await http.get(base.with_path(f"/v2/{repo}/manifests/{tag}"), accept=MANIFEST_TYPES, scope=scope)
    m = page.body if isinstance(page.body, dict) else {}
    media = str(m.get("mediaType") or page.headers.get("Content-Type", "")).split(";")[0].strip()
    if media in INDEX_TYPES or (not m.get("layers") and isinstance(m.get("manifests"), list)):
        children = [c for c in m.get("manifests") or () if isinstance(c, dict) and c.get("digest")]
        if children:
            child = await http.get(base.with_path(f"/v2/{repo}/manifests/{children[0]['digest']}"),
                                   accept=MANIFEST_TYPES, scope=scope)
            cm = child.body if isinstance(child.body, dict) else {}
            size, fmt, tags = describe(cm, m.get("annotations") or {})
        else:
            size, fmt, tags = describe({"annotations": m.get("annotations") or {}})
    else:
        size, fmt, tags = describe(m)
    return Found(name=_entry_name(repo, prefix, tag), reference=f"oci://{host}/{repo}:{tag}", size_bytes=size,
                 format=fmt, tags=tags | {tag})


async def list_oci(http: RegistryHTTP, url: str, *, want: Callable[[str], bool],
                   limit: int) -> tuple[list[Found], bool]:
    """The models of one OCI registry whose name ``want`` accepts; (found, truncated)."""
    base, host, prefix = split_url(url)
    candidates: list[tuple[str, str]] = []
    for repo in await repositories(http, base, prefix):
        try:
            tags = await _paged(http, base.with_path(f"/v2/{repo}/tags/list").with_query(n=PAGE), "tags",
                                f"repository:{repo}:pull")
        except RegistryError as e:
            if e.reason == "NotFound" and repo != prefix:
                continue  # listed by the catalog, deleted since
            raise
        candidates.extend((repo, t) for t in sorted(set(tags)) if want(_entry_name(repo, prefix, t)))
    truncated = len(candidates) > limit
    results = await asyncio.gather(*(manifest_entry(http, base, host, r, prefix, t) for r, t in candidates[:limit]),
                                   return_exceptions=True)
    found: list[Found] = []
    for res in results:
        if isinstance(res, RegistryError) and res.reason == "NotFound":
            continue  # a tag deleted between the listing and its manifest
        if isinstance(res, BaseException):
            raise res
        found.append(res)
    return found, truncated
