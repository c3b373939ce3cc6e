"""Remote peers of ``flexinfer serve`` (``peers:`` in its config, llama-swap's shape): models served
by forwarding to another OpenAI-compatible server, usually over https with an API key.

Owns: the peer URL rules (:func:`split_url`: ``https://host[:port][/path]`` or ``http://``, the path
becoming a prefix of every forwarded path), the peers' views (always ready: nothing to start; one
endpoint whose :class:`~flexinfer.runtime.base.UpstreamLink` carries TLS settings and the API key,
so the proxy's pool dials TLS and sets ``Authorization: Bearer``) and :class:`PeeredInventory`, the
local runtime's inventory with the peers' models in front of it (``/v1/models`` lists both).
Must not: do I/O, start anything, or let a peer's name shadow a local model (the config refuses it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from flexinfer.runtime.base import Endpoint, Inventory, ModelView

if TYPE_CHECKING:
    from flexinfer.runtime.localconfig import PeerSpec

__all__ = ["PeeredInventory", "peer_views", "split_url"]


def split_url(url: str) -> tuple[str, str]:
    """``https://host[:port][/path]`` -> (``https://host[:port]``, ``/path`` without a trailing ``/``;
    "" when none). ValueError for another scheme, a query, or a bad host/port."""
    s = url.strip()
    scheme, sep, rest = s.partition("://")
    if not sep or scheme not in ("http", "https"):
        raise ValueError(f"peer URL {url!r} must start with https:// or http://")
    if "?" in rest or "#" in rest:
        raise ValueError(f"peer URL {url!r} must not have a query or fragment")
    hostport, slash, path = rest.partition("/")
    base = f"{scheme}://{hostport}"
    Endpoint.parse(base)  # the host/port rules, raised as ValueError
    prefix = ("/" + path).rstrip("/") if slash else ""
    return base, prefix


def peer_views(peers: Iterable[PeerSpec]) -> list[ModelView]:
    """One ready view per model of each peer."""
    out: list[ModelView] = []
    for p in peers:
        base, prefix = split_url(p.proxy)
        ep = Endpoint.parse(base, ca_file=p.ca_file, insecure_skip_verify=p.insecure_skip_verify,
                            api_key=p.api_key, path_prefix=prefix)
        for m in p.models:
            out.append(ModelView(name=m, endpoints=(ep,), ready=True, owned_by=f"peer:{p.name}",
                                 metadata={"peer": p.name, "state": "peer"}))
    return out


class PeeredInventory:
    """An inventory (the local runtime's) with the peers' views in front: a dict lookup first."""

    def __init__(self, inner: Inventory, peers: Iterable[ModelView]) -> None:
        self.inner = inner
        self.peers: dict[str, ModelView] = {v.name: v for v in peers}

    def resolve(self, name: str) -> ModelView | None:
        view = self.peers.get(name)
        return view if view is not None else self.inner.resolve(name)

    def models(self) -> Iterable[ModelView]:
        return [*self.inner.models(), *self.peers.values()]

    def subscribe(self, callback: Callable[[ModelView], None]) -> None:
        self.inner.subscribe(callback)  # peers' views never change while serving
