"""Local stand-ins for the Hugging Face Hub and Ollama (neither can be reached from the test machines).

They answer with the JSON shapes the services document, nothing more:

- ``HubServer``: ``GET /api/models`` with ``author``, ``search`` (substring of the id,
  case-insensitive), ``filter`` (tags, all required), ``limit`` and ``cursor``; a next page is
  announced by ``Link: <...&cursor=N>; rel="next"`` as the Hub does; each model is
  ``{"_id", "id", "modelId", "author", "tags", "downloads", "likes", "siblings": [{"rfilename"}],
  "gguf"?: {"total", "architecture"}, "safetensors"?: {"total"}}``. ``token`` set: requests without
  ``Authorization: Bearer <token>`` get 401 ``{"error": "Invalid credentials in Authorization header"}``.
- ``OllamaServer``: ``GET /api/tags`` -> ``{"models": [{"name", "model", "modified_at", "size",
  "digest", "details": {"format", "family", "families", "parameter_size", "quantization_level"}}]}``.

Every request is recorded (path, query, Authorization) for the tests to look at.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aiohttp.web
from yarl import URL

from tests.oci_registry import AioServer


def hf_model(mid: str, tags: Sequence[str] = (), files: Sequence[str] = ("README.md",), *,
             gguf: bool = False) -> dict[str, Any]:
    m: dict[str, Any] = {"_id": mid.replace("/", "-"), "id": mid, "modelId": mid, "author": mid.split("/")[0],
                         "tags": list(tags), "downloads": 10, "likes": 1, "private": False,
                         "siblings": [{"rfilename": f} for f in files]}
    if gguf:
        m["gguf"] = {"total": 494032768, "architecture": "qwen2", "context_length": 32768}
    if any(f.endswith(".safetensors") for f in files):
        m["safetensors"] = {"parameters": {"BF16": 494032768}, "total": 494032768}
    return m


class HubServer(AioServer):
    def __init__(self, models: Sequence[dict[str, Any]], *, token: str | None = None) -> None:
        super().__init__()
        self.models = list(models)
        self.token = token

    def routes(self, app: aiohttp.web.Application) -> None:
        app.router.add_get("/api/models", self._models)

    async def _models(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self.record(request)
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return aiohttp.web.json_response({"error": "Invalid credentials in Authorization header"}, status=401)
        q = request.query
        out = self.models
        if q.get("author"):
            out = [m for m in out if m["author"] == q["author"]]
        if q.get("search"):
            out = [m for m in out if q["search"].lower() in m["id"].lower()]
        for t in q.getall("filter", []):
            out = [m for m in out if t in m["tags"]]
        limit, start = int(q.get("limit", "1000")), int(q.get("cursor", "0"))
        page = out[start:start + limit]
        headers = {}
        if start + limit < len(out):
            nxt = URL(str(request.url)).update_query(cursor=str(start + limit))
            headers["Link"] = f'<{nxt}>; rel="next"'
        if q.get("full") != "true":
            page = [{k: v for k, v in m.items() if k != "siblings"} for m in page]
        return aiohttp.web.json_response(page, headers=headers)


class OllamaServer(AioServer):
    def __init__(self, models: Sequence[dict[str, Any]]) -> None:
        super().__init__()
        self.models = list(models)

    def routes(self, app: aiohttp.web.Application) -> None:
        app.router.add_get("/api/tags", self._tags)

    async def _tags(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self.record(request)
        return aiohttp.web.json_response({"models": self.models})


def ollama_model(name: str, size: int, family: str = "llama", quant: str = "Q4_K_M") -> dict[str, Any]:
    return {"name": name, "model": name, "modified_at": "2025-10-03T23:34:03.409490317-07:00", "size": size,
            "digest": "a2af6cc3eb7fa8be8504abaf9b04e88f17a119ec3f04a3addf55f92841195f5a",
            "details": {"parent_model": "", "format": "gguf", "family": family, "families": [family],
                        "parameter_size": "8.0B", "quantization_level": quant}}
