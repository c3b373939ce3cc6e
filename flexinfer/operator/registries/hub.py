"""The Hugging Face Hub and Ollama clients of the ModelCatalog.

Owns:

- ``list_hf``: ``GET <hub>/api/models?search=&author=&filter=<tag>...&limit=100&full=true`` (the Hub's
  models API, ``Authorization: Bearer <HF_TOKEN>`` when the Secret has one), pages followed through
  ``Link: <...>; rel="next"`` (the Hub's cursor), at most ``MAX_PAGES``. The registry URL is the Hub
  (default ``https://huggingface.co``); a path after it is the author (``https://huggingface.co/Qwen``).
  ``search`` is the longest literal run of the name pattern (the Hub matches substrings; the glob is
  applied after). Each model: ``id`` -> name and ``HF://<id>``; format ``gguf`` when the model has a
  ``gguf`` block, a ``gguf`` tag or a ``.gguf`` sibling, else ``safetensors`` likewise; size = the sum
  of ``siblings[].size`` when the Hub sends sizes (it does with ``blobs``), else none.
- ``list_ollama``: ``GET <url>/api/tags`` (``{"models": [{name, size, digest, details: {format, family,
  parameter_size, quantization_level}}]}``, the Ollama API's list; default ``https://ollama.com``, or
  an Ollama server such as ``http://ollama:11434``): ``ollama://<name>``, size, ``details.format``;
  tags are the format, family and quantization level.

Neither service can be reached from the test machines: tests/operator/hub_servers.py answers with
the documented JSON shapes.

Must not: know Kubernetes objects or the catalog's status.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from yarl import URL

from flexinfer.operator.registries import Found, RegistryError, RegistryHTTP

HF_DEFAULT = "https://huggingface.co"
OLLAMA_DEFAULT = "https://ollama.com"
MAX_PAGES = 20
HF_PAGE = 100


def search_term(pattern: str | None) -> str | None:
    """The longest literal run of a glob (``*llama-3*instruct*`` -> ``llama-3``), or None."""
    if not pattern:
        return None
    runs = [r for r in re.split(r"[*?\[\]]+", pattern) if r]
    return max(runs, key=len) if runs else None


def _hf_format(m: dict[str, Any], files: Iterable[str]) -> str | None:
    tags = {str(t).lower() for t in m.get("tags") or ()}
    names = [f.lower() for f in files]
    if m.get("gguf") or "gguf" in tags or any(n.endswith(".gguf") for n in names):
        return "gguf"
    if m.get("safetensors") or "safetensors" in tags or any(n.endswith(".safetensors") for n in names):
        return "safetensors"
    return None


def hf_found(m: dict[str, Any]) -> Found | None:
    mid = m.get("id") or m.get("modelId")
    if not isinstance(mid, str) or not mid:
        return None
    siblings = [s for s in m.get("siblings") or () if isinstance(s, dict)]
    files = [str(s.get("rfilename") or "") for s in siblings]
    sizes = [s.get("size") for s in siblings]
    size = sum(s for s in sizes if isinstance(s, int)) if any(isinstance(s, int) for s in sizes) else None
    fmt = _hf_format(m, files)
    tags = {str(t) for t in m.get("tags") or () if isinstance(t, str)}
    if fmt:
        tags.add(fmt)
    return Found(name=mid, reference=f"HF://{mid}", size_bytes=size, format=fmt, tags=frozenset(tags))


async def list_hf(http: RegistryHTTP, url: str | None, *, want: Callable[[str], bool], tags: Iterable[str],
                  pattern: str | None, limit: int) -> tuple[list[Found], bool]:
    u = URL(url or HF_DEFAULT)
    if u.scheme not in ("http", "https") or not u.host:
        raise RegistryError("InvalidURL", f"{url!r} is not a Hugging Face Hub URL")
    author = u.path.strip("/") or None
    query: list[tuple[str, str]] = [("limit", str(HF_PAGE)), ("full", "true")]
    if author:
        query.append(("author", author))
    term = search_term(pattern)
    if term:
        query.append(("search", term))
    query.extend(("filter", t) for t in tags)
    next_url: URL | None = u.with_path("/api/models").with_query(query)
    found: list[Found] = []
    truncated = False
    for _ in range(MAX_PAGES):
        if next_url is None:
            break
        page = await http.get(next_url)
        if not isinstance(page.body, list):
            raise RegistryError("BadResponse", f"{http.what}: /api/models did not answer a list")
        for m in page.body:
            f = hf_found(m) if isinstance(m, dict) else None
            if f is not None and want(f.name):
                found.append(f)
        next_url = page.next_url
        if len(found) > limit:
            truncated = True
            break
    else:
        truncated = next_url is not None
    return found[:limit], truncated


def ollama_found(m: dict[str, Any]) -> Found | None:
    name = m.get("name") or m.get("model")
    if not isinstance(name, str) or not name:
        return None
    raw = m.get("details")
    d: dict[str, Any] = raw if isinstance(raw, dict) else {}
    fmt = str(d.get("format") or "") or None
    tags = {str(d[k]) for k in ("format", "family", "quantization_level") if d.get(k)}
    size = m.get("size") if isinstance(m.get("size"), int) and m["size"] >= 0 else None
    return Found(name=name, reference=f"ollama://{name}", size_bytes=size, format=fmt, tags=frozenset(tags))


async def list_ollama(http: RegistryHTTP, url: str | None, *, want: Callable[[str], bool],
                      limit: int) -> tuple[list[Found], bool]:
    u = URL(url or OLLAMA_DEFAULT)
    if u.scheme not in ("http", "https") or not u.host:
        raise RegistryError("InvalidURL", f"{url!r} is not an Ollama URL")
    page = await http.get(u.with_path(u.path.rstrip("/") + "/api/tags"))
    models = page.body.get("models") if isinstance(page.body, dict) else None
    if not isinstance(models, list):
        raise RegistryError("BadResponse", f"{http.what}: /api/tags has no models list")
    found = [f for f in (ollama_found(m) for m in models if isinstance(m, dict)) if f is not None and want(f.name)]
    return found[:limit], len(found) > limit
