"""``flexinfer proxy``: run the OpenAI-compatible proxy in front of a static inventory file, or, with
``--kube``, in front of the models of a Kubernetes namespace (``POD_NAMESPACE``; ``--all-namespaces``).

(The local runtime is ``flexinfer serve``.) This module only wires parts together (a composition
root, see :mod:`flexinfer.cmd`); it imports the inventories, and ``flexinfer.runtime.kube`` lazily.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from typing import TYPE_CHECKING, Any

from flexinfer.settings import ProxySettings, SettingsError, load_proxy_settings

if TYPE_CHECKING:
    from flexinfer.cmd.workers import SharedParts
    from flexinfer.http.server import HTTPServer
    from flexinfer.proxy.pipeline import ProxyHandler
    from flexinfer.runtime.kube import KubeRuntime, KubeTimings

log = logging.getLogger("flexinfer.proxy")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", help="static inventory YAML (models -> backend URLs)")
    p.add_argument("--kube", action="store_true",
                   help="serve the Models/ModelDeployments of the cluster (namespace from POD_NAMESPACE)")
    p.add_argument("--all-namespaces", action="store_true",
                   help="with --kube: watch every namespace (models elsewhere are named <namespace>/<name>)")
    p.add_argument("--global", dest="global_", nargs="?", const="", default=None, metavar="FILE",
                   help="the global proxy: in front of the clusters' proxies of a GlobalProxy file "
                        "(or, with --kube, of the GlobalProxy resource --global-name; docs/globalproxy.md)")
    p.add_argument("--global-name", default=None,
                   help="with --global --kube: the GlobalProxy's name (default: the only one of the namespace)")
    for what, meta, text in (("ca", "FILE", "PEM trust root of the https members (instead of the system CAs)"),
                             ("cert", "FILE", "PEM client certificate presented to the https members (mTLS)"),
                             ("key", "FILE", "PEM key of --global-tls-cert")):
        p.add_argument(f"--global-tls-{what}", default=None, metavar=meta,
                       help=f"with --global FILE: {text} (with --kube: the GlobalProxy's tls.secretRef)")
    p.add_argument("--host", default=None, help="listen address (env PROXY_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="listen port (env PROXY_PORT, default 8080)")
    p.add_argument("--workers", type=int, default=None, help="worker processes sharing the port")
    p.add_argument("--check", action="store_true", help="with -c: validate the inventory file, exit 0 or 2")
    p.add_argument("--schema", action="store_true", help="print the inventory file's JSON Schema and exit")


def build_kube(settings: ProxySettings, *, all_namespaces: bool = False, api_client: Any = None,
               timings: KubeTimings | None = None,
               parts: SharedParts | None = None) -> tuple[KubeRuntime, ProxyHandler]:
    """(KubeRuntime, ProxyHandler) wired together: the runtime reads the handler's load through a
    :class:`ProxyLoad` (router in-flight counts for the demand heartbeat, activator queue depths for
    GPUGroup queues). Call ``await runtime.start()`` in the serving loop."""
    from flexinfer.cmd.load import ProxyLoad
    from flexinfer.proxy.pipeline import ProxyHandler
    from flexinfer.runtime.kube import KubeRuntime, KubeTimings

    load = ProxyLoad()
    runtime = KubeRuntime(settings.namespace, all_namespaces=all_namespaces, api_client=api_client,
                          timings=timings or KubeTimings(), load=load)
    handler = (parts.handler(runtime, scaler=runtime) if parts is not None
               else ProxyHandler(runtime, settings, scaler=runtime))
    load.bind(handler)
    return runtime, handler


#: Net new container objects between two young-generation collections (CPython's default: 700).
#: A proxied request leaves no cyclic garbage behind (measured: 1,005 objects collected in 1,075
#: collections over 42,000 requests), but under load the young generation holds every in-flight
#: request's objects, and at 700 it was walked every few requests: 3.7 % of the proxy's CPU at 64
#: connections (perf). At 10,000 none ran in 24,561 requests (18,516 plain, 6,045 streams, 64
#: connections), and the peak RSS is unchanged (docs/benchmarks.md). Workers inherit it (fork).
GC_YOUNG_THRESHOLD = 10_000


def tune_gc() -> None:
    """The serving process's collector: young collections as rare as :data:`GC_YOUNG_THRESHOLD`
    says, the older generations' ratios as CPython sets them."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def _freeze_heap() -> None:
    """Move everything built at startup (modules, settings, inventory) out of the cyclic GC's reach,
    so that collections triggered by per-request garbage never walk it again."""
    gc.collect()
    gc.freeze()


def run(args: argparse.Namespace) -> int:
    from flexinfer.http.server import run as serve_http

    if args.schema or args.check:
        return _schema_or_check(args)
    try:
        settings = load_proxy_settings(host=args.host, port=args.port, workers=args.workers)
    except SettingsError as exc:
        print(f"flexinfer proxy: {exc}", file=sys.stderr)
        return 2
    from flexinfer import _compiled

    _compiled.log_start(log)
    tune_gc()
    if getattr(args, "global_", None) is not None:
        from flexinfer.cmd.globalproxy import run_global

        return run_global(settings, args, serve_http)
    if getattr(args, "kube", False):
        return _run_kube(settings, args, serve_http)
    from flexinfer.runtime.static import InventoryConfigError, StaticInventory

    if not args.config:
        print("flexinfer proxy: -c/--config <inventory.yaml> or --kube is required", file=sys.stderr)
        return 2
    try:
        inventory = StaticInventory.from_file(args.config)
    except InventoryConfigError as exc:
        print(exc, file=sys.stderr)  # FILE:LINE: path: message, one line per problem
        return 2
    from flexinfer.cmd.workers import SharedParts
    from flexinfer.proxy.scheduler import spec_error

    for v in inventory.models():
        why = spec_error(v.routing, v.scheduler)
        if why is not None:
            print(f"flexinfer proxy: {args.config}: model {v.name!r}: scheduler: {why}", file=sys.stderr)
            return 2
    names = ", ".join(v.name for v in inventory.models())
    log.info("flexinfer proxy on http://%s:%d serving %s", settings.host, settings.port, names)
    parts = SharedParts(settings)  # before the fork: the children inherit the shared memory
    _freeze_heap()
    try:
        return int(serve_http(lambda: parts.handler(inventory, health_check=True), settings.http, host=settings.host,
                              port=settings.port, workers=settings.workers, on_start=parts.start,
                              on_stop=parts.stop, on_worker_exit=parts.worker_exited))
    finally:
        parts.close()


def _schema_or_check(args: argparse.Namespace) -> int:
    """``--schema``: the static file's JSON Schema; ``--check -c FILE``: its problems (exit 2) or ok."""
    from flexinfer.runtime.static import InventoryConfigError, load_static, static_schema

    if args.schema:
        import json

        print(json.dumps(static_schema(), indent=2))
        return 0
    if not args.config:
        print("flexinfer proxy: --check needs -c/--config <inventory.yaml>", file=sys.stderr)
        return 2
    from flexinfer.proxy.scheduler import spec_error

    try:
        views = load_static(args.config)
    except InventoryConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    bad = [f"{args.config}: model {v.name!r}: scheduler: {why}" for v in views
           if (why := spec_error(v.routing, v.scheduler)) is not None]
    print("\n".join(bad) if bad else f"{args.config}: ok", file=sys.stderr if bad else sys.stdout)
    return 2 if bad else 0


def _run_kube(settings: ProxySettings, args: argparse.Namespace, serve_http: Any) -> int:
    """One process: the KubeRuntime in the serving loop. ``--workers N`` (N > 1): the parent
    supervises one inventory owner (a sidecar running the KubeRuntime: the only watches and patches
    of the machine) and N workers, each with a :class:`RemoteKubeInventory` of the owner's inventory
    over a Unix socket in a private temp directory (removed at exit)."""
    import importlib.util

    if importlib.util.find_spec("kubernetes_asyncio") is None:
        print("flexinfer proxy: --kube needs the kube extra (pip install 'flexinfer[kube]')", file=sys.stderr)
        return 2
    if args.config:
        print("flexinfer proxy: use either -c/--config or --kube, not both", file=sys.stderr)
        return 2
    from flexinfer.cmd.workers import SharedParts

    scope = "all namespaces" if args.all_namespaces else f"namespace {settings.namespace}"
    parts = SharedParts(settings)  # before the fork: the children inherit the shared memory
    if settings.workers <= 1:
        runtimes: list[KubeRuntime] = []

        def make_handler() -> ProxyHandler:  # built in the serving loop, started in on_start
            runtime, handler = build_kube(settings, all_namespaces=args.all_namespaces, parts=parts)
            runtimes.append(runtime)
            return handler

        async def on_start(server: HTTPServer) -> None:
            await parts.start(server)
            await runtimes[-1].start()

        async def on_stop(server: HTTPServer) -> None:
            await runtimes[-1].stop()
            await parts.stop(server)

        log.info("flexinfer proxy on http://%s:%d serving the models of %s", settings.host, settings.port, scope)
        try:
            return int(serve_http(make_handler, settings.http, host=settings.host, port=settings.port,
                                  workers=1, on_start=on_start, on_stop=on_stop))
        finally:
            parts.close()

    import os
    import shutil
    import tempfile

    from flexinfer.cmd.load import ProxyLoad
    from flexinfer.http.server import Sidecar
    from flexinfer.runtime.kube import KubeTimings
    from flexinfer.runtime.kubeowner import run_owner  # imports the kube client here, before the fork
    from flexinfer.runtime.kuberemote import RemoteKubeInventory

    timings = KubeTimings()
    private = tempfile.mkdtemp(prefix="flexinfer-proxy-")  # mode 0700
    path = os.path.join(private, "inventory.sock")

    machine = parts.machine
    assert machine is not None  # several workers always share a machine state

    def owner() -> int:  # the sidecar: the machine's one KubeRuntime
        counts = machine.reader()  # every worker's open requests (the demand heartbeat)
        return run_owner(path, settings.namespace, all_namespaces=args.all_namespaces, timings=timings,
                         in_flight=counts.get)

    remotes: list[RemoteKubeInventory] = []

    def make_worker_handler() -> ProxyHandler:
        load = ProxyLoad()
        remote = RemoteKubeInventory(path, load=load, queue_refresh=timings.queue_refresh,
                                     sync_wait=timings.sync_timeout + 2.0)  # the owner's lists + its start
        handler = parts.handler(remote, scaler=remote)
        load.bind(handler)
        remotes.append(remote)
        return handler

    async def start_remote(server: HTTPServer) -> None:
        await parts.start(server)
        await remotes[-1].start()

    async def stop_remote(server: HTTPServer) -> None:
        await remotes[-1].stop()
        await parts.stop(server)

    log.info("flexinfer proxy on http://%s:%d serving the models of %s (%d workers, one inventory owner)",
             settings.host, settings.port, scope, settings.workers)
    try:
        return int(serve_http(make_worker_handler, settings.http, host=settings.host, port=settings.port,
                              workers=settings.workers, on_start=start_remote, on_stop=stop_remote,
                              on_worker_exit=parts.worker_exited, sidecars=[Sidecar("kube-inventory", owner)]))
    finally:
        shutil.rmtree(private, ignore_errors=True)
        parts.close()
