"""``flexinfer serve -c <file>``: the proxy and the local runtime in one process (the embedded default).

Without ``-c`` it serves the config shipped in the package (SmolLM2); ``--check`` validates a file
without starting anything, ``--schema`` prints its JSON Schema (docs/config.md).

Models declared in the file are started on demand as local processes, stopped when idle, and
served through the same OpenAI endpoint, with the runtime's admin pages (``/``, ``/status``,
``/running``, ``/load/<model>``, ``/unload``, ``/logs/<model>``; docs/status-page.md) next to it. One worker: the processes belong to this process.
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
    p.add_argument("-c", "--config", default=None,
                   help="local models YAML (default: the config shipped in the package: SmolLM2)")
    p.add_argument("--check", action="store_true",
                   help="validate the config (model files and commands exist too), start nothing, exit 0 or 2")
    p.add_argument("--schema", action="store_true", help="print the config's JSON Schema and exit")
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
    handler = ProxyHandler(runtime, settings, scaler=runtime, admin=LocalAdmin(runtime, load, totals=load))
    load.bind(handler)
    handler.metrics.registry.register(SwapCollector(runtime))
    return runtime, handler


def check(path: str) -> int:
    """``--check``: every problem of the file on stderr (exit 2), or one ok line (exit 0)."""
    from flexinfer.proxy.scheduler import spec_error
    from flexinfer.runtime.localconfig import check_local_config, load_local_config

    problems = check_local_config(path)
    if not problems:
        for spec in load_local_config(path):
            why = spec_error(spec.routing, spec.scheduler)
            if why is not None:
                problems.append(f"{path}: model {spec.name!r}: scheduler: {why}")
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        return 2
    print(f"{path}: ok")
    return 0


def run(args: argparse.Namespace) -> int:
    from flexinfer import _compiled, _speedups
    from flexinfer.http.server import run as serve_http
    from flexinfer.runtime.localconfig import DEFAULT_CONFIG, local_schema
    from flexinfer.runtime.static import InventoryConfigError

    if args.schema:
        import json

        print(json.dumps(local_schema(), indent=2))
        return 0
    args.config = args.config or DEFAULT_CONFIG
    if args.check:
        return check(args.config)
    try:
        settings = load_proxy_settings(host=args.host, port=args.port, workers=1)
        runtime, handler = build(args.config, settings)
    except (SettingsError, InventoryConfigError) as exc:
        print(f"flexinfer serve: {exc}" if isinstance(exc, SettingsError) else exc, file=sys.stderr)
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
