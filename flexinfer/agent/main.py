"""``flexinfer agent``: the GPU node agent (a DaemonSet), the one writer of its Node's GPU keys.

Every ``--interval`` (30 s): discover GPUs (NVML → amdsmi → sysfs), scrape the KV-cache usage of the
FlexInfer model pods on this node, read the Node, and send a merge patch with only what changed
(nothing when nothing did). Prometheus gauges per GPU are served on ``--metrics-port`` (9100; 0 = off)
by prometheus_client's own server. Needs ``NODE_NAME``; ``POD_NAMESPACE`` is informational.
A missing GPU, a failing backend, an unreachable apiserver or a refused patch never stops the loop;
each distinct failure is logged once until it changes or heals.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from flexinfer import labels
from flexinfer.agent.discovery import GPU, Discovery, OnceLog
from flexinfer.agent.kv import scrape_kv_usage
from flexinfer.agent.publish import desired_state, node_patch
from flexinfer.k8s.client import new_api_client
from flexinfer.settings import SettingsError, from_env
from flexinfer.settings import setting as _f

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """Settings of the node agent, read once (flags override the environment)."""

    node_name: str = _f("", "NODE_NAME", "The Node this agent runs on (required).")
    namespace: str = _f("default", "POD_NAMESPACE", "Namespace of the agent pod.")
    interval: float = _f(30.0, "FLEXINFER_AGENT_INTERVAL", "Seconds between two publications.")
    label_prefix: str = _f(labels.PREFIX, "FLEXINFER_LABEL_PREFIX", "Prefix of the node keys the agent owns.")
    metrics_port: int = _f(9100, "FLEXINFER_AGENT_METRICS_PORT", "Prometheus port; 0 disables it.")
    host_root: str = _f("/", "FLEXINFER_HOST_ROOT", "Where the host's /sys and /proc are mounted.")
    amd_min_discrete_vram_mb: int = _f(4096, "FLEXINFER_AMD_MIN_DISCRETE_VRAM_MB",
                                       "AMD GPUs with less VRAM are integrated GPUs and ignored.")
    kv_timeout: float = _f(2.0, None, "Timeout of one /metrics scrape.")
    kv_pod_selector: str = _f(f"{labels.MANAGED_BY}={labels.MANAGED_BY_VALUE}", None,
                              "Label selector of the model pods whose KV usage is averaged.")

    def validate(self) -> None:
        if not self.node_name:
            raise SettingsError("NODE_NAME is required (set it from spec.nodeName with the downward API)")
        if self.interval <= 0:
            raise SettingsError("the interval must be > 0")


class AgentMetrics:
    """The agent's Prometheus objects in their own registry."""

    GPU_LABELS = ("gpu", "vendor", "model")

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r, gl = self.registry, self.GPU_LABELS
        self.mem_total = Gauge("flexinfer_gpu_memory_total_bytes", "GPU memory size.", gl, registry=r)
        self.mem_used = Gauge("flexinfer_gpu_memory_used_bytes", "GPU memory in use.", gl, registry=r)
        self.util = Gauge("flexinfer_gpu_utilization_ratio", "GPU busy ratio (0..1).", gl, registry=r)
        self.temp = Gauge("flexinfer_gpu_temperature_celsius", "GPU temperature.", gl, registry=r)
        self.gpus = Gauge("flexinfer_node_gpus", "GPUs found on this node.", registry=r)
        self.kv = Gauge("flexinfer_node_kv_cache_usage_ratio", "Average KV-cache usage of the model pods.",
                        registry=r)
        self.backend = Gauge("flexinfer_agent_discovery_backend_up", "1 when the discovery backend works.",
                             ["backend"], registry=r)
        self.writes = Counter("flexinfer_agent_node_writes_total", "Node publications by result.", ["result"],
                              registry=r)
        self.duration = Histogram("flexinfer_agent_iteration_duration_seconds", "Time of one iteration.",
                                  registry=r, buckets=(0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10))
        self._series: set[tuple[str, str, str]] = set()

    def observe(self, gpus: list[GPU], kv: float | None, sources: Mapping[str, bool]) -> None:
        """Set the per-GPU gauges; series of GPUs that disappeared are removed."""
        now: set[tuple[str, str, str]] = set()
        for g in gpus:
            key = (f"{g.vendor.lower()}{g.index}", g.vendor, g.name)
            now.add(key)
            for gauge, value in ((self.mem_total, g.vram_total_mb), (self.mem_used, g.vram_used_mb)):
                if value is not None:
                    gauge.labels(*key).set(value * 1024 * 1024)
            if g.util_pct is not None:
                self.util.labels(*key).set(g.util_pct / 100.0)
            if g.temperature_c is not None:
                self.temp.labels(*key).set(g.temperature_c)
        for gone in self._series - now:
            for gauge in (self.mem_total, self.mem_used, self.util, self.temp):
                with contextlib.suppress(KeyError):
                    gauge.remove(*gone)
        self._series = now
        self.gpus.set(len(gpus))
        self.kv.set(kv if kv is not None else 0.0)
        for name, up in sources.items():
            self.backend.labels(name).set(1 if up else 0)


class Agent:
    """One node's publisher. ``tick()`` is one iteration; ``run()`` repeats it every interval."""

    def __init__(self, settings: AgentSettings, discovery: Discovery, core: Any,
                 metrics: AgentMetrics | None = None,
                 kv_scraper: Callable[[list[dict[str, Any]]], Awaitable[float | None]] | None = None) -> None:
        self.settings = settings
        self.discovery = discovery
        self.core = core  # kubernetes_asyncio CoreV1Api
        self.metrics = metrics or AgentMetrics()
        self.keys = labels.node_keys(settings.label_prefix)
        self.kv_scraper = kv_scraper or (lambda pods: scrape_kv_usage(pods, timeout=settings.kv_timeout))
        self.once = OnceLog(log)
        self.last_patch: dict[str, Any] = {}

    async def model_pods(self) -> list[dict[str, Any]]:
        """Raw dicts of the FlexInfer model pods on this node (one list call, no model objects)."""
        resp = await self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.settings.node_name}",
            label_selector=self.settings.kv_pod_selector, _preload_content=False)
        try:
            if resp.status != 200:
                raise RuntimeError(f"listing pods answered HTTP {resp.status}")
            body = orjson.loads(await resp.read())
        finally:
            resp.release()
        items = body.get("items") if isinstance(body, dict) else None
        return [p for p in items or [] if isinstance(p, dict)]

    async def tick(self) -> dict[str, Any] | None:
        """One iteration. Returns the patch sent ({} when nothing changed), None when it failed."""
        t0 = time.perf_counter()
        try:
            gpus = await asyncio.to_thread(self.discovery.gpus)
            avx512 = self.discovery.cpu_avx512()
            kv: float | None = None
            try:
                kv = await self.kv_scraper(await self.model_pods())
                self.once.ok("kv-scrape")
            except Exception as exc:
                if self.once.failed("kv-scrape", f"{type(exc).__name__}: {exc}", logging.WARNING):
                    log.debug("kv scrape failure", exc_info=True)
            self.metrics.observe(gpus, kv, self.discovery.sources)
            desired = desired_state(gpus, kv_usage=kv, avx512=avx512, keys=self.keys)
            try:
                node = await self.core.read_node(self.settings.node_name)
                patch = node_patch(desired, node.metadata.labels, node.metadata.annotations, self.keys)
                if patch:
                    await self.core.patch_node(self.settings.node_name, patch)
                    self.metrics.writes.labels("written").inc()
                else:
                    self.metrics.writes.labels("unchanged").inc()
                self.once.ok("node")
            except Exception as exc:
                self.metrics.writes.labels("error").inc()
                status = getattr(exc, "status", None)
                self.once.failed("node", f"{type(exc).__name__} {status or ''}: {getattr(exc, 'reason', exc)}",
                                 logging.WARNING)
                return None
            self.last_patch = patch
            return patch
        finally:
            self.metrics.duration.observe(time.perf_counter() - t0)

    async def run(self, stop: asyncio.Event) -> None:
        """Tick every interval until ``stop`` is set (the first tick runs at once)."""
        while not stop.is_set():
            await self.tick()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.interval)


# ---- CLI -------------------------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    """Flags of ``flexinfer agent`` (each overrides its environment variable)."""
    parser.add_argument("--interval", default=None, help="time between publications, e.g. 30s (default 30s)")
    parser.add_argument("--metrics-port", type=int, default=None, help="Prometheus port, 0 = off (default 9100)")
    parser.add_argument("--label-prefix", default=None, help=f"prefix of the node keys (default {labels.PREFIX})")
    parser.add_argument("--host-root", default=None, help="where the host's /sys and /proc are (default /)")
    parser.add_argument("--kubeconfig", default=None,
                        help="kubeconfig file (default: in-cluster config, else $KUBECONFIG/~/.kube/config)")
    parser.add_argument("--once", action="store_true", help="publish once and exit")


def load_agent_settings(args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None) -> AgentSettings:
    """Environment, then flags."""
    from flexinfer.settings import parse_duration

    overrides: dict[str, Any] = {}
    if args is not None:
        if getattr(args, "interval", None) is not None:
            overrides["interval"] = parse_duration("--interval", args.interval)
        for name in ("metrics_port", "label_prefix", "host_root"):
            if getattr(args, name, None) is not None:
                overrides[name] = getattr(args, name)
    settings: AgentSettings = from_env(AgentSettings, env, **overrides)
    return settings


async def amain(settings: AgentSettings, kubeconfig: str | None = None, *, once: bool = False,
                stop: asyncio.Event | None = None) -> int:
    """Run the agent until SIGTERM/SIGINT (or ``stop``); returns the exit code."""
    from kubernetes_asyncio import client as k8s
    from prometheus_client import start_http_server

    metrics = AgentMetrics()
    server: Any = None
    if settings.metrics_port and not once:
        try:
            server = start_http_server(settings.metrics_port, registry=metrics.registry)
        except OSError as exc:  # the port is taken (or not ours to bind): say so, no traceback
            log.error("agent: cannot serve metrics on port %d: %s", settings.metrics_port,
                      exc.strerror or exc)
            return 2
    discovery = Discovery(root=settings.host_root, amd_min_discrete_mb=settings.amd_min_discrete_vram_mb)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    if not once:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop.set)
                handled.append(sig)
    api = await new_api_client(kubeconfig)
    try:
        agent = Agent(settings, discovery, k8s.CoreV1Api(api), metrics)
        log.info("agent for node %s: every %.0fs, prefix %s, metrics port %s", settings.node_name,
                 settings.interval, settings.label_prefix, settings.metrics_port or "off")
        if once:
            return 0 if await agent.tick() is not None else 1
        await agent.run(stop)
        return 0
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        await api.close()
        discovery.close()
        if server is not None:
            with contextlib.suppress(Exception):
                srv = server[0] if isinstance(server, tuple) else server
                srv.shutdown()


def run(args: argparse.Namespace) -> int:
    """Entry point of ``flexinfer agent``."""
    try:
        settings = load_agent_settings(args)
    except SettingsError as exc:
        log.error("%s", exc)
        return 2
    from flexinfer.k8s.client import kubeconfig_problem

    if (why := kubeconfig_problem(args.kubeconfig)) is not None:
        log.error("agent: %s", why)
        return 2
    return asyncio.run(amain(settings, args.kubeconfig, once=args.once))
