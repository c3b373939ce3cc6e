"""The global runtime: an :class:`~flexinfer.runtime.base.Inventory` whose endpoints are the member
clusters' FlexInfer proxies (``flexinfer proxy --global``, docs/globalproxy.md).

The configuration is a ``GlobalProxy`` resource (``examples/v1alpha2/globalproxy.yaml``), from a
file (``--global FILE``, with any ``FederatedModel`` documents of the same file for their
``routing``) or from the hub cluster (``runtime.kubeglobal``). Every ``probe.interval`` each member
proxy is probed (``GET probe.path``, then ``GET /v1/models`` for the models it serves); a member
that refuses the connection is out at once, one that fails :data:`FAIL_THRESHOLD` probes in a row
(timeout, error status) is out after the last of them, and one probe that passes brings it back.
A model's view lists the members that serve it and are in, ordered and routed by the strategy:

- ``RoundRobin``: routing ``round-robin`` over the members in their configured order;
- ``Failover``: routing ``failover`` (the first one not excluded) in ``failoverOrder``;
- ``Latency``: routing ``failover`` in the order of the probes' round-trip (an EWMA; the leader is
  replaced only by one :data:`LATENCY_MARGIN` faster, so that probe noise does not flap);
- ``Weighted`` (a FederatedModel's ``routing`` only): routing ``weighted`` with its ``weights``.

A model named by a FederatedModel takes that resource's ``routing``; the others the GlobalProxy's
``strategy``. The move to another member before any byte is sent is the forwarder's retry on a
refused connection (``proxy.forward``), not this module's.

Owns: the configuration's parse, the probes, the per-member state (:class:`Member`), the views, the
per-cluster metrics (:meth:`GlobalRuntime.collector`) and the status the ``GlobalProxy`` gets
(:meth:`GlobalRuntime.status`). Must not: import the proxy or a Kubernetes client, or retry requests.
"""

from __future__ import annotations

import asyncio
import logging
import math
import ssl
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
import yaml
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from flexinfer.api.common import SpecError
from flexinfer.api.federation import FederatedModel, FederatedRouting, GlobalProxy, GlobalProxySpec
from flexinfer.http.tls import tls_context
from flexinfer.runtime.base import Endpoint, ModelView, StaticInventoryBase, UpstreamLink

__all__ = ["FAIL_THRESHOLD", "GlobalConfig", "GlobalConfigError", "GlobalRuntime", "Member", "TLSFiles", "empty_config",
           "load_global", "parse_global"]

log = logging.getLogger("flexinfer.proxy.global")

#: consecutive failed probes (timeout, error status) that take a member out; a refusal takes it out at once
FAIL_THRESHOLD = 2
#: a new Latency leader must be this much faster than the current one
LATENCY_MARGIN = 0.8
EWMA_ALPHA = 0.3
MAX_PROBE_BODY = 1 << 20
_STRATEGY_ROUTING = {"RoundRobin": "round-robin", "Failover": "failover", "Latency": "failover",
                     "Weighted": "weighted"}


class GlobalConfigError(ValueError):
    """A ``--global`` file that cannot be used (the message names the file)."""


@dataclass(frozen=True, slots=True)
class TLSFiles:
    """The trust root and client certificate of the https members (PEM files): from the GlobalProxy's
    ``tls.secretRef`` (``runtime.kubeglobal`` writes them) or a static file's ``--global-tls-*``."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


@dataclass(frozen=True, slots=True)
class GlobalConfig:
    name: str
    spec: GlobalProxySpec
    routing: Mapping[str, FederatedRouting] = field(default_factory=dict)  # model -> its FederatedModel's
    generation: int | None = None
    tls: TLSFiles | None = None


def empty_config(name: str = "") -> GlobalConfig:
    """No clusters yet (``--kube`` before the GlobalProxy is read): every model is unknown."""
    return GlobalConfig(name, GlobalProxySpec(None, "RoundRobin", (), (), None, False, "/healthz", 2.0, 5.0))


def parse_global(docs: Iterable[Any], where: str = "GlobalProxy", *, strict: bool = True) -> GlobalConfig:
    """One GlobalProxy object and any FederatedModel objects -> :class:`GlobalConfig`. ``strict``
    (a file): an endpoint the proxy cannot dial is an error; otherwise (a resource) that cluster is
    kept, never probed, and reported in the status."""
    proxies: list[GlobalProxy] = []
    routing: dict[str, FederatedRouting] = {}
    for i, doc in enumerate(d for d in docs if d is not None):
        kind = doc.get("kind") if isinstance(doc, Mapping) else None
        try:
            if kind == "GlobalProxy":
                proxies.append(GlobalProxy.from_obj(doc))
            elif kind == "FederatedModel":
                fm = FederatedModel.from_obj(doc)
                routing[fm.meta.name] = fm.spec.routing
            else:
                raise GlobalConfigError(f"{where}: document {i}: kind {kind!r} (expected GlobalProxy or FederatedModel)")
        except SpecError as exc:
            raise GlobalConfigError(f"{where}: document {i} ({kind}): {exc}") from None
    if len(proxies) != 1:
        raise GlobalConfigError(f"{where}: expected exactly one GlobalProxy, found {len(proxies)}")
    gp = proxies[0]
    for c in gp.spec.clusters if strict else ():
        try:
            _endpoint(c.endpoint, gp.spec.insecure_skip_verify)  # fail early on a URL the client cannot dial
        except ValueError as exc:
            raise GlobalConfigError(f"{where}: cluster {c.name!r}: {exc}") from None
    return GlobalConfig(gp.meta.name, gp.spec, routing, gp.meta.generation or None)


def load_global(path: str) -> GlobalConfig:
    try:
        with open(path, encoding="utf-8") as f:
            docs = list(yaml.safe_load_all(f))
    except (OSError, yaml.YAMLError) as exc:
        raise GlobalConfigError(f"{path}: {exc}") from None
    try:
        return parse_global(docs, path)
    except ValueError as exc:
        raise GlobalConfigError(str(exc) if str(exc).startswith(path) else f"{path}: {exc}") from None


def _endpoint(url: str, insecure_skip_verify: bool = False, tls: TLSFiles | None = None) -> Endpoint:
    """A member's endpoint: ``https://`` is verified against ``tls.ca_file`` (the Secret's ``ca.crt``),
    else the system CAs (``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` name others), unless
    ``spec.tls.insecureSkipVerify``; with ``tls.cert_file`` it presents that client certificate."""
    ep = Endpoint.parse(url, insecure_skip_verify=insecure_skip_verify, ca_file=tls.ca_file if tls else None)
    if tls is not None and tls.cert_file and ep.link is not None and ep.link.tls:
        ep = replace(ep, link=replace(ep.link, cert_file=tls.cert_file, key_file=tls.key_file))
    return ep


@dataclass(slots=True)
class Member:
    """What the global proxy knows of one member proxy."""

    name: str
    url: str
    endpoint: Endpoint | None
    weight: int | None = None
    ready: bool = False
    probed: bool = False  # at least one probe ended
    fails: int = 0  # consecutive failed probes
    latency_s: float | None = None  # EWMA of the probe round-trips
    last_latency_s: float | None = None
    error: str = ""
    models: frozenset[str] = frozenset()
    probes_ok: int = 0
    probes_failed: int = 0
    transitions: int = 0


async def http_get(host: str, port: int, path: str, timeout: float,
                   ssl_context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    """One ``GET`` on a fresh connection (Connection: close; the body read by its Content-Length,
    chunks, or to EOF), over TLS with ``ssl_context``. ConnectionRefusedError on a refusal;
    TimeoutError past ``timeout``; ssl.SSLError (an OSError) on a failed handshake."""
    async with asyncio.timeout(timeout):
        r, w = await asyncio.open_connection(host, port, limit=MAX_PROBE_BODY, ssl=ssl_context)
        try:
            w.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
                    "User-Agent: flexinfer-global-proxy\r\n\r\n".encode("latin-1"))
            try:
                head = await r.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                raise ValueError("connection closed before an HTTP answer") from None
            parts = head.split(b"\r\n", 1)[0].split()
            if len(parts) < 2 or not parts[1].isdigit():
                raise ValueError("invalid HTTP answer")
            fields = {k.strip().lower(): v.strip() for k, _, v in
                      (ln.partition(b":") for ln in head.split(b"\r\n")[1:] if ln)}
            if b"content-length" in fields:
                n = int(fields[b"content-length"])
                if n > MAX_PROBE_BODY:
                    raise ValueError("answer too large")
                body = await r.readexactly(n)
            elif b"chunked" in fields.get(b"transfer-encoding", b"").lower():
                out = bytearray()
                while (n := int((await r.readuntil(b"\r\n")).split(b";")[0].strip() or b"0", 16)) > 0:
                    if len(out) + n > MAX_PROBE_BODY:
                        raise ValueError("answer too large")
                    out += await r.readexactly(n)
                    await r.readexactly(2)
                body = bytes(out)
            else:
                body = await r.read(MAX_PROBE_BODY)
        finally:
            w.close()
            try:
                await w.wait_closed()
            except OSError:
                pass
    return int(parts[1]), body


class GlobalRuntime(StaticInventoryBase):
    """The member proxies as an inventory (models learned from their ``/v1/models``), probed."""

    scaler = None

    def __init__(self, config: GlobalConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(())
        self._clock = clock
        self.config = config
        self.members: dict[str, Member] = {}
        self._leader: str | None = None
        self._task: asyncio.Task[None] | None = None
        self.rounds = 0
        self.on_round: list[Callable[[], Any]] = []
        self._contexts: dict[UpstreamLink, ssl.SSLContext] = {}
        self.configure(config)

    # -- configuration ---------------------------------------------------------------------------
    def configure(self, config: GlobalConfig) -> None:
        """Take a new configuration (file or resource): members kept by name keep their state."""
        self.config = config
        old = self.members
        members: dict[str, Member] = {}
        for c in config.spec.clusters:
            try:
                ep: Endpoint | None = _endpoint(c.endpoint, config.spec.insecure_skip_verify, config.tls)
                err = ""
            except ValueError as exc:
                ep, err = None, str(exc)
            m = old.get(c.name)
            if m is None or m.url != c.endpoint:
                m = Member(c.name, c.endpoint, ep, c.weight, error=err, probed=ep is None)
            m.weight = c.weight
            m.endpoint = ep  # new TLS files: a new link (a new pool); the probe state stays
            members[c.name] = m
        self.members = members
        self._rebuild()

    # -- probing ---------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.probe_all()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="global-probes")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.spec.probe_interval_s)
            try:
                await self.probe_all()
            except Exception:  # a bug in one round must not end the probes
                log.exception("global proxy: probe round failed")

    async def probe_all(self) -> None:
        await asyncio.gather(*(self._probe(m) for m in list(self.members.values()) if m.endpoint is not None))
        self.rounds += 1
        self._rebuild()
        for cb in self.on_round:
            cb()

    async def _probe(self, m: Member) -> None:
        assert m.endpoint is not None
        spec = self.config.spec
        t0 = self._clock()
        try:
            ctx = self._tls(m.endpoint)
            status, _ = await http_get(m.endpoint.host, m.endpoint.port, spec.probe_path, spec.probe_timeout_s, ctx)
            rtt = self._clock() - t0
            if not 200 <= status < 300:
                raise ValueError(f"probe {spec.probe_path} answered {status}")
            status, body = await http_get(m.endpoint.host, m.endpoint.port, "/v1/models", spec.probe_timeout_s,
                                          ctx)
            if status != 200:
                raise ValueError(f"/v1/models answered {status}")
            data = orjson.loads(body).get("data") or []
            models = frozenset(d["id"] for d in data if isinstance(d, dict) and isinstance(d.get("id"), str))
        except (ConnectionRefusedError, ConnectionResetError) as exc:
            self._failed(m, f"connection refused ({exc.__class__.__name__})", at_once=True)
            return
        except TimeoutError:
            self._failed(m, f"probe timed out after {spec.probe_timeout_s:g}s")
            return
        except (OSError, ValueError, AttributeError, KeyError, asyncio.IncompleteReadError) as exc:
            self._failed(m, str(exc) or exc.__class__.__name__)
            return
        m.probes_ok += 1
        m.probed, m.fails, m.error, m.models = True, 0, "", models
        m.last_latency_s = rtt
        m.latency_s = rtt if m.latency_s is None else EWMA_ALPHA * rtt + (1 - EWMA_ALPHA) * m.latency_s
        if not m.ready:
            m.ready, m.transitions = True, m.transitions + 1
            log.warning("global proxy: cluster %s (%s) is back", m.name, m.url)

    def _tls(self, ep: Endpoint) -> ssl.SSLContext | None:
        """The probes' TLS context of an https member (made once per link), or None."""
        link = ep.link
        if link is None or not link.tls:
            return None
        ctx = self._contexts.get(link)
        if ctx is None:
            ctx = tls_context(link.ca_file, link.insecure_skip_verify, link.cert_file, link.key_file)
            self._contexts = {k: v for k, v in self._contexts.items()  # bounded: the links in use
                              if any(m.endpoint is not None and m.endpoint.link == k for m in self.members.values())}
            self._contexts[link] = ctx
        return ctx

    def _failed(self, m: Member, why: str, *, at_once: bool = False) -> None:
        m.probes_failed += 1
        m.probed, m.fails, m.error = True, m.fails + 1, why
        if m.ready and (at_once or m.fails >= FAIL_THRESHOLD):
            m.ready, m.transitions = False, m.transitions + 1
            log.warning("global proxy: cluster %s (%s) out: %s", m.name, m.url, why)

    # -- views -----------------------------------------------------------------------------------
    def _latency_order(self) -> list[Member]:
        ready = [m for m in self.members.values() if m.ready]
        ready.sort(key=lambda m: m.latency_s if m.latency_s is not None else math.inf)
        leader = self.members.get(self._leader or "")
        if (leader is not None and leader.ready and ready and ready[0] is not leader
                and leader.latency_s is not None and ready[0].latency_s is not None
                and ready[0].latency_s > LATENCY_MARGIN * leader.latency_s):
            ready.remove(leader)
            ready.insert(0, leader)
        self._leader = ready[0].name if ready else None
        return ready

    def _ordered(self, strategy: str, order: tuple[str, ...], latency: list[Member]) -> list[Member]:
        if strategy == "Latency":
            return latency
        members = list(self.members.values())
        if strategy == "Failover" and order:
            rank = {n: i for i, n in enumerate(order)}
            members.sort(key=lambda m: rank.get(m.name, len(rank)))
        return [m for m in members if m.ready]

    def _rebuild(self) -> None:
        spec = self.config.spec
        latency = self._latency_order()
        # a FederatedModel's model is known even while no member serves it (503, not 404)
        names = sorted({n for m in self.members.values() for n in m.models} | set(self.config.routing))
        views = []
        for name in names:
            fed = self.config.routing.get(name)
            strategy = fed.strategy if fed is not None else spec.strategy
            order = (fed.failover_order or spec.failover_order) if fed is not None else spec.failover_order
            members = [m for m in self._ordered(strategy, order, latency) if name in m.models]
            weights: dict[str, int] = {}
            if strategy == "Weighted" and fed is not None:
                for m in members:
                    w = fed.weights.get(m.name, m.weight if m.weight is not None else 0)
                    weights[m.endpoint.key if m.endpoint else m.name] = int(w)
            eps = tuple(m.endpoint for m in members if m.endpoint is not None)
            views.append(ModelView(name=name, endpoints=eps, ready=bool(eps),
                                   routing=_STRATEGY_ROUTING.get(strategy, "round-robin"),
                                   owned_by="flexinfer-global", weights=weights,
                                   metadata={"backend": "global", "strategy": strategy,
                                             "clusters": tuple(m.name for m in members)}))
        self.replace(views)

    # -- status and metrics ----------------------------------------------------------------------
    def active_cluster(self) -> str | None:
        """The member that gets traffic first under the GlobalProxy's strategy (None: none is in)."""
        spec = self.config.spec
        ordered = self._ordered(spec.strategy, spec.failover_order, self._latency_order())
        return ordered[0].name if ordered else None

    def status(self) -> dict[str, Any]:
        """The ``GlobalProxy`` status as this proxy sees its members (conditions without times:
        the writer stamps them)."""
        members = list(self.members.values())
        healthy = [m.name for m in members if m.ready]
        # no latency figures here (they are in the metrics): a status that changed every round
        # would be written every round
        detail = "; ".join(f"{m.name}: {'ready' if m.ready else 'out'}"
                           + (f" ({m.error})" if m.error and not m.ready else "") for m in members)
        if not self.rounds and not any(m.probed for m in members):
            cond = ("Unknown", "Probing", "no probe round has ended yet")
        elif len(healthy) == len(members):
            cond = ("True", "AllClustersHealthy", detail)
        elif healthy:
            cond = ("True", "Degraded", detail)
        else:
            cond = ("False", "NoHealthyCluster", detail)
        out: dict[str, Any] = {"healthyClusters": len(healthy), "totalClusters": len(members),
                               "activeCluster": self.active_cluster(),
                               "conditions": [{"type": "Ready", "status": cond[0], "reason": cond[1],
                                               "message": cond[2][:4096]}]}
        if self.config.generation is not None:
            out["observedGeneration"] = self.config.generation
        return out

    def collector(self) -> Collector:
        return _MemberCollector(self)


class _MemberCollector(Collector):
    def __init__(self, rt: GlobalRuntime) -> None:
        self.rt = rt

    def collect(self) -> Iterator[Any]:
        ready = GaugeMetricFamily("flexinfer_global_cluster_ready",
                                  "1 while the member cluster's proxy passes its probes", labels=["cluster"])
        latency = GaugeMetricFamily("flexinfer_global_cluster_probe_latency_seconds",
                                    "probe round-trip to the member proxy (EWMA)", labels=["cluster"])
        models = GaugeMetricFamily("flexinfer_global_cluster_models",
                                   "models the member proxy lists", labels=["cluster"])
        probes = CounterMetricFamily("flexinfer_global_cluster_probes", "probes of the member proxy",
                                     labels=["cluster", "result"])
        transitions = CounterMetricFamily("flexinfer_global_cluster_transitions",
                                          "times the member went in or out", labels=["cluster"])
        for m in list(self.rt.members.values()):
            ready.add_metric([m.name], 1.0 if m.ready else 0.0)
            if m.latency_s is not None:
                latency.add_metric([m.name], m.latency_s)
            models.add_metric([m.name], float(len(m.models)))
            probes.add_metric([m.name, "ok"], float(m.probes_ok))
            probes.add_metric([m.name, "failed"], float(m.probes_failed))
            transitions.add_metric([m.name], float(m.transitions))
        yield from (ready, latency, models, probes, transitions)
