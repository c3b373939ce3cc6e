"""``flexinfer serve -c <file>``: the proxy and the local runtime in one process (the embedded default).

Models declared in the file are started on demand as local processes, stopped when idle, and
served through the same OpenAI endpoint, with the runtime's admin pages (``/``, ``/running``,
``/unload``, ``/logs/<model>``) next to it. One worker: the processes belong to this process.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from flexinfer.settings import ProxySettings, SettingsError, load_proxy_settings

if TYPE_CHECKING:
    from flexinfer.http.server import HTTPServer
    from flexinfer.proxy.pipeline import ProxyHandler
    from flexinfer.runtime.local import LocalRuntime

log = logging.getLogger("flexinfer.serve")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", default="examples/local.yaml", help="local models YAML")
    p.add_argument("--host", default=None, help="listen address (env PROXY_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="listen port (env PROXY_PORT, default 8080)")


def build(config: str, settings: ProxySettings) -> tuple[LocalRuntime, ProxyHandler]:
    """(runtime, handler) wired together; used by ``run`` and by tests. The runtime reads the
    handler's load (router in-flight counts, activator queue depths) through a :class:`ProxyLoad`."""
    from flexinfer.cmd.load import ProxyLoad
    from flexinfer.proxy.pipeline import ProxyHandler
    from flexinfer.runtime.admin import LocalAdmin
    from flexinfer.runtime.local import LocalRuntime, SwapCollector
    from flexinfer.runtime.localconfig import load_local_config

    load = ProxyLoad()
    runtime = LocalRuntime(load_local_config(config), drain_timeout=settings.http.drain_timeout, load=load)
    handler = ProxyHandler(runtime, settings, scaler=runtime, admin=LocalAdmin(runtime, load))
    load.bind(handler)
    handler.metrics.registry.register(SwapCollector(runtime))
    return runtime, handler


def run(args: argparse.Namespace) -> int:
    from flexinfer import _compiled, _speedups
    from flexinfer.http.server import run as serve_http
    from flexinfer.runtime.static import InventoryConfigError

    try:
        settings = load_proxy_settings(host=args.host, port=args.port, workers=1)
        runtime, handler = build(args.config, settings)
    except (SettingsError, InventoryConfigError) as exc:
        print(f"flexinfer serve: {exc}", file=sys.stderr)
        return 2
    from flexinfer.proxy.scheduler import spec_error

    for v in runtime.models():
        why = spec_error(v.routing, v.scheduler)
        if why is not None:
            print(f"flexinfer serve: {args.config}: model {v.name!r}: scheduler: {why}", file=sys.stderr)
            return 2
    names = ", ".join(runtime.procs)
    log.info("speedups: %s", _speedups.IMPLEMENTATION)
    if _compiled.stale():
        log.warning("compiled request path older than its source, using the source of %s; run `make ext`",
                    ", ".join(_compiled.stale()))
    log.info("flexinfer serve on http://%s:%d  models: %s (started on first request)",
             settings.host, settings.port, names)

    async def on_stop(_server: HTTPServer) -> None:
        await runtime.stop_all()

    return serve_http(lambda: handler, settings.http, host=settings.host, port=settings.port, workers=1,
                      on_stop=on_stop)
