"""Remote peers of ``flexinfer serve`` (``peers:`` in its config, llama-swap's shape): models served
by forwarding to another OpenAI-compatible server, usually over https with an API key.

Owns: the ``peers:`` entries' types (:class:`Peer`, :func:`parse_peers`, used by
flexinfer.runtime.localconfig), the peer URL rules (:func:`split_url`: ``https://host[:port][/path]`` or ``http://``, the path
becoming a prefix of every forwarded path), the peers' views (always ready: nothing to start; one
endpoint whose :class:`~flexinfer.runtime.base.UpstreamLink` carries TLS settings and the API key,
so the proxy's pool dials TLS and sets ``Authorization: Bearer``) and :class:`PeeredInventory`, the
local runtime's inventory with the peers' models in front of it (``/v1/models`` lists both).
Must not: do I/O, start anything, or let a peer's name shadow a local model (the config refuses it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any

import msgspec

from flexinfer.runtime.base import Endpoint, Inventory, ModelView
from flexinfer.runtime.configfile import Path, Source, convert, expand_tree, unescape

__all__ = ["Peer", "PeerSpec", "PeeredInventory", "parse_peers", "peer_views", "split_url"]

#: what the proxy accepts as a model name (flexinfer.proxy.extract), "/" included: org/model at a peer
PEER_MODEL_PATTERN = r"^[A-Za-z0-9](?:[A-Za-z0-9._:/@+\-]{0,254}[A-Za-z0-9])?$"


class Peer(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A remote OpenAI-compatible server whose models serve forwards to (llama-swap's ``peers``)."""

    proxy: Annotated[str, msgspec.Meta(
        description="the peer's base URL: https://host[:port][/path] (or http://); the request path is "
                    "appended")]
    models: Annotated[list[Annotated[str, msgspec.Meta(pattern=PEER_MODEL_PATTERN)]], msgspec.Meta(
        min_length=1, description="model names served by the peer (listed in /v1/models)")]
    api_key: Annotated[str | None, msgspec.Meta(
        description="sent as Authorization: Bearer to the peer (e.g. ${env.KEY}); the client's own "
                    "Authorization is never forwarded to a peer")] = None
    ca_file: Annotated[str | None, msgspec.Meta(
        description="https: PEM file of the CAs to trust instead of the system ones")] = None
    insecure_skip_verify: Annotated[bool, msgspec.Meta(
        description="https: skip certificate verification (testing only)")] = False


@dataclass(frozen=True, slots=True)
class PeerSpec:
    """One entry of ``peers:``, macros expanded (see :class:`Peer`)."""

    name: str
    proxy: str
    models: tuple[str, ...]
    api_key: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    insecure_skip_verify: bool = False


def parse_peers(src: Source, raw_peers: dict[str, Any], macros: dict[str, str], local: set[str],
                builtins: frozenset[str]) -> list[PeerSpec]:
    """``peers:``: typed, macros (``${env.KEY}``) expanded, a URL the upstream client can dial, model
    names unique against the local models and the other peers."""
    out: list[PeerSpec] = []
    seen: dict[str, str] = {}
    for name, raw in raw_peers.items():
        path: Path = ("peers", name)
        if isinstance(raw, Mapping):
            raw = {k: (unescape(expand_tree(src, v, (*path, str(k)), macros.get, frozenset(),
                                            (builtins, "is filled in only in cmd and args")))
                       if k in Peer.__struct_fields__ else v) for k, v in raw.items()}
        p = convert(src, raw if raw is not None else {}, Peer, path)
        if p is None:
            continue
        try:
            split_url(p.proxy)
        except ValueError as exc:
            src.error((*path, "proxy"), str(exc))
            continue
        for j, m in enumerate(p.models):
            other = seen.get(m) or ("a local model" if m in local else None)
            if other is not None:
                src.error((*path, "models", j), f"model {m!r} is also served by {other}")
            seen[m] = f"peer {name!r}"
        out.append(PeerSpec(name, p.proxy, tuple(p.models), p.api_key or None, p.ca_file, p.insecure_skip_verify))
    return out


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
    """An inventory (the local runtime's) with the peers' views in front: a dict lookup first.
    :meth:`set_peers` replaces them (a config reload) and tells the subscribers."""

    def __init__(self, inner: Inventory, peers: Iterable[ModelView]) -> None:
        self.inner = inner
        self.peers: dict[str, ModelView] = {v.name: v for v in peers}
        self._callbacks: list[Callable[[ModelView], None]] = []

    def set_peers(self, peers: Iterable[ModelView]) -> list[str]:
        """The peers' views from now on; each new or changed view goes to the subscribers (a
        removed one too, not ready, so followers drop its endpoint). Returns the changed names."""
        new = {v.name: v for v in peers}
        old, self.peers = self.peers, new
        changed = [n for n, v in new.items() if old.get(n) != v]
        gone = [v for n, v in old.items() if n not in new]
        for v in [*(new[n] for n in changed), *(replace(v, ready=False, endpoints=()) for v in gone)]:
            for cb in list(self._callbacks):
                cb(v)
        return [*changed, *(v.name for v in gone)]

    def resolve(self, name: str) -> ModelView | None:
        view = self.peers.get(name)
        return view if view is not None else self.inner.resolve(name)

    def models(self) -> Iterable[ModelView]:
        return [*self.inner.models(), *self.peers.values()]

    def subscribe(self, callback: Callable[[ModelView], None]) -> None:
        self.inner.subscribe(callback)
        self._callbacks.append(callback)  # peers change only by set_peers (a reload)
