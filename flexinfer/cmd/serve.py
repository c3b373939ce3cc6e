"""``flexinfer serve -c <file>``: the proxy and the local runtime in one process (the embedded default).

Models declared in the file are started on demand as local processes, stopped when idle, and
served through the same OpenAI endpoint, with the runtime's admin pages (``/``, ``/running``,
``/unload``, ``/logs/<model>``) next to it. One worker: the processes belong to this process.
"""

from __future__ import annotations

import argparse
import logging
import sys

from flexinfer.settings import SettingsError, load_proxy_settings

log = logging.getLogger("flexinfer.serve")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", default="examples/local.yaml", help="local models YAML")
    p.add_argument("--host", default=None, help="listen address (env PROXY_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="listen port (env PROXY_PORT, default 8080)")


def build(config: str, settings: object) -> tuple[object, object]:
    """(runtime, handler) wired together; used by ``run`` and by tests."""
    from flexinfer.proxy.pipeline import ProxyHandler
    from flexinfer.runtime.admin import LocalAdmin
    from flexinfer.runtime.local import LocalRuntime
    from flexinfer.runtime.localconfig import load_local_config

    runtime = LocalRuntime(load_local_config(config), drain_timeout=settings.http.drain_timeout)  # type: ignore[attr-defined]
    handler = ProxyHandler(runtime, settings, scaler=runtime)  # type: ignore[arg-type]
    activator = handler.activator

    def depth(model: str) -> int:
        q = activator.queues.get(model) if activator is not None else None
        return len(q.waiters) if q is not None else 0

    handler.admin = LocalAdmin(runtime, depth)
    runtime.in_flight = lambda key: handler.router.in_flight.get(key, 0)
    return runtime, handler


def run(args: argparse.Namespace) -> int:
    from flexinfer import _speedups
    from flexinfer.http.server import run as serve_http
    from flexinfer.runtime.static import InventoryConfigError

    try:
        settings = load_proxy_settings(host=args.host, port=args.port, workers=1)
        runtime, handler = build(args.config, settings)
    except (SettingsError, InventoryConfigError) as exc:
        print(f"flexinfer serve: {exc}", file=sys.stderr)
        return 2
    names = ", ".join(runtime.procs)  # type: ignore[attr-defined]
    log.info("speedups: %s", _speedups.IMPLEMENTATION)
    log.info("flexinfer serve on http://%s:%d  models: %s (started on first request)",
             settings.host, settings.port, names)

    async def on_stop(_server: object) -> None:
        await runtime.stop_all()  # type: ignore[attr-defined]

    return serve_http(lambda: handler, settings.http, host=settings.host,  # type: ignore[arg-type, return-value]
                      port=settings.port, workers=1, on_stop=on_stop)
