"""``flexinfer proxy --global``: the proxy's pipeline in front of the member clusters' proxies
(docs/globalproxy.md): a :class:`~flexinfer.runtime.globalrt.GlobalRuntime` from a GlobalProxy
file (``--global FILE``) or, with ``--kube``, from the hub's GlobalProxy resource
(:mod:`flexinfer.runtime.kubeglobal`, which also writes its status).

Owns: wiring only (a composition root): the runtime joined to the ordinary ``ProxyHandler``, its
per-cluster metrics registered in the handler's registry, its probes started and stopped with the
server, and a member the probes bring back re-admitted by the router's ejector (the refusals of
its outage ejected it for ``PROXY_EJECT_BASE`` seconds). Must not: route, probe or parse anything itself.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from flexinfer.settings import ProxySettings

if TYPE_CHECKING:
    from flexinfer.http.server import HTTPServer
    from flexinfer.proxy.pipeline import ProxyHandler
    from flexinfer.runtime.globalrt import GlobalRuntime


def run_global(settings: ProxySettings, args: argparse.Namespace, serve_http: Any) -> int:
    import logging

    from flexinfer.cmd.workers import SharedParts
    from flexinfer.runtime.globalrt import GlobalConfigError, GlobalRuntime, empty_config, load_global

    log = logging.getLogger("flexinfer.proxy")
    kube = bool(getattr(args, "kube", False))
    if args.config:
        print("flexinfer proxy: --global takes its own file (--global FILE), not -c", file=sys.stderr)
        return 2
    if kube == bool(args.global_):
        print("flexinfer proxy: --global FILE, or --global --kube (the hub's GlobalProxy)", file=sys.stderr)
        return 2
    if settings.workers > 1:
        print("flexinfer proxy: --global runs one worker (its probes and status are per process)", file=sys.stderr)
        return 2
    if kube:
        import importlib.util

        if importlib.util.find_spec("kubernetes_asyncio") is None:
            print("flexinfer proxy: --kube needs the kube extra (pip install 'flexinfer[kube]')", file=sys.stderr)
            return 2
        config = empty_config(args.global_name or "")
    else:
        try:
            config = load_global(args.global_)
        except GlobalConfigError as exc:
            print(f"flexinfer proxy: {exc}", file=sys.stderr)
            return 2
    tls_args = [getattr(args, f"global_tls_{w}", None) for w in ("ca", "cert", "key")]
    if any(tls_args):
        if kube:
            print("flexinfer proxy: --global-tls-* are for --global FILE (with --kube: spec.tls.secretRef)",
                  file=sys.stderr)
            return 2
        if bool(tls_args[1]) != bool(tls_args[2]):
            print("flexinfer proxy: --global-tls-cert and --global-tls-key go together", file=sys.stderr)
            return 2
        import dataclasses
        import ssl

        from flexinfer.http.tls import tls_context
        from flexinfer.runtime.globalrt import TLSFiles

        try:
            tls_context(tls_args[0], False, tls_args[1], tls_args[2])
        except (OSError, ssl.SSLError) as exc:
            print(f"flexinfer proxy: --global-tls-*: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
            return 2
        config = dataclasses.replace(config, tls=TLSFiles(*tls_args))
    parts = SharedParts(settings)
    built: list[tuple[GlobalRuntime, ProxyHandler]] = []
    closers: list[Any] = []

    def make_handler() -> ProxyHandler:
        runtime = GlobalRuntime(config)
        handler = parts.handler(runtime)
        handler.metrics.registry.register(runtime.collector())
        ejector = handler.router.ejector
        if ejector is not None:  # a member the probes bring back was ejected by its outage's refusals
            seen: dict[str, bool] = {}

            def readmit() -> None:
                for m in runtime.members.values():
                    if m.endpoint is not None and m.ready and seen.get(m.name) is False:
                        ejector.readmit(m.endpoint.key)
                    seen[m.name] = m.ready

            runtime.on_round.append(readmit)
        built.append((runtime, handler))
        return handler

    async def on_start(server: HTTPServer) -> None:
        await parts.start(server)
        runtime = built[-1][0]
        if kube:
            from flexinfer.k8s.client import new_api_client
            from flexinfer.runtime.kubeglobal import KubeGlobalSource

            api = await new_api_client()
            closers.append(api)
            source = KubeGlobalSource(runtime, api, settings.namespace, args.global_name)
            closers.append(source)
            await source.start()
        await runtime.start()

    async def on_stop(server: HTTPServer) -> None:
        await built[-1][0].stop()
        for c in reversed(closers):
            await (c.stop() if hasattr(c, "stop") else c.close())
        await parts.stop(server)

    what = f"GlobalProxy {args.global_name or '(the only one)'} of namespace {settings.namespace}" if kube \
        else f"{args.global_} ({len(config.spec.clusters)} clusters, {config.spec.strategy})"
    log.info("flexinfer global proxy on http://%s:%d in front of %s", settings.host, settings.port, what)
    try:
        return int(serve_http(make_handler, settings.http, host=settings.host, port=settings.port, workers=1,
                              on_start=on_start, on_stop=on_stop))
    finally:
        parts.close()
