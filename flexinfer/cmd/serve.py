"""``flexinfer serve -c <file>``: the proxy and the local runtime in one process (the embedded default).

Without ``-c`` it serves the config shipped in the package (SmolLM2); ``--check`` validates a file
without starting anything, ``--schema`` prints its JSON Schema (docs/config.md).

Models declared in the file are started on demand as local processes, stopped when idle, and
served through the same OpenAI endpoint, with the runtime's admin pages (``/``, ``/status``,
``/running``, ``/load/<model>``, ``/unload``, ``/logs/<model>``, ``/config``; docs/status-page.md)
next to it. One worker: the processes belong to this process.
The file is watched (``--watch-interval``) and SIGHUP reloads it: :mod:`flexinfer.runtime.reload`.
``hooks.on_startup.preload`` models are started in the background once it listens (:func:`preload`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import TYPE_CHECKING

from flexinfer.settings import ProxySettings, SettingsError, load_proxy_settings

if TYPE_CHECKING:
    from flexinfer.http.server import HTTPServer
    from flexinfer.proxy.pipeline import ProxyHandler
    from flexinfer.runtime.base import ModelView
    from flexinfer.runtime.local import LocalRuntime
    from flexinfer.runtime.localconfig import LocalModelSpec
    from flexinfer.runtime.reload import ConfigWatcher

log = logging.getLogger("flexinfer.serve")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", default=None,
                   help="local models YAML (default: the config shipped in the package: SmolLM2)")
    p.add_argument("--check", action="store_true",
                   help="validate the config (model files and commands exist too), start nothing, exit 0 or 2")
    p.add_argument("--schema", action="store_true", help="print the config's JSON Schema and exit")
    p.add_argument("--host", default=None, help="listen address (env PROXY_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="listen port (env PROXY_PORT, default 8080)")
    p.add_argument("--watch-interval", type=float, default=1.0, metavar="SECONDS",
                   help="look at the config file every SECONDS and reload it when it changed (0: off; "
                        "SIGHUP always reloads; default 1)")


def build(config: str, settings: ProxySettings) -> tuple[LocalRuntime, ProxyHandler]:
    """(runtime, handler) wired together; used by tests (``run`` uses :func:`build_watched`)."""
    runtime, handler, _watcher = build_watched(config, settings)
    return runtime, handler


def build_watched(config: str, settings: ProxySettings,
                  watch_interval: float = 1.0) -> tuple[LocalRuntime, ProxyHandler, ConfigWatcher]:
    """(runtime, handler, watcher) wired together. The runtime reads the handler's load (router
    in-flight counts, activator queue depths) through a :class:`ProxyLoad`; the watcher reloads the
    runtime from ``config`` (started by ``watcher.start()`` in the serving loop)."""
    from flexinfer.cmd.load import ProxyLoad
    from flexinfer.proxy.pipeline import ProxyHandler
    from flexinfer.runtime.admin import LocalAdmin
    from flexinfer.runtime.local import LocalRuntime, SwapCollector
    from flexinfer.runtime.localconfig import load_local_config, load_peers
    from flexinfer.runtime.peers import PeeredInventory, peer_views
    from flexinfer.runtime.reload import ConfigWatcher, ReloadAdmin, ReloadCollector, file_digest

    load = ProxyLoad()
    digest = file_digest(config)  # before the load: a change made meanwhile is seen by the first poll
    runtime = LocalRuntime(load_local_config(config), drain_timeout=settings.http.drain_timeout, load=load)
    # remote models (docs/tls.md): read with the models, at start and by every reload (a reload that
    # a bad peer entry refuses keeps the old peers as it keeps the old models)
    inventory = PeeredInventory(runtime, peer_views(load_peers(config)))
    staged: list[list[ModelView]] = []

    def load_all(path: str) -> list[LocalModelSpec]:
        specs = load_checked(path)
        staged[:] = [peer_views(load_peers(path))]
        return specs

    def apply_peers() -> dict[str, list[str]]:
        return {"peers": inventory.set_peers(staged.pop())} if staged else {}

    watcher = ConfigWatcher(config, runtime, load_all, interval=watch_interval, digest=digest,
                            after_apply=apply_peers)
    handler = ProxyHandler(inventory, settings, scaler=runtime,
                           admin=ReloadAdmin(LocalAdmin(runtime, load, totals=load), watcher))
    load.bind(handler)
    handler.metrics.registry.register(SwapCollector(runtime))
    handler.metrics.registry.register(ReloadCollector(watcher))
    return runtime, handler, watcher


def load_checked(path: str) -> list[LocalModelSpec]:
    """The file's models, as a reload takes them: the typed config plus the scheduler check
    (raises :class:`~flexinfer.runtime.configfile.InventoryConfigError` with every problem)."""
    from flexinfer.proxy.scheduler import spec_error
    from flexinfer.runtime.configfile import InventoryConfigError
    from flexinfer.runtime.localconfig import load_local_config

    specs = load_local_config(path)
    problems = [f"{path}: model {s.name!r}: scheduler: {why}" for s in specs
                if (why := spec_error(s.routing, s.scheduler)) is not None]
    if problems:
        raise InventoryConfigError(problems)
    return specs


async def preload(runtime: LocalRuntime, names: list[str]) -> None:
    """Start ``names`` one after the other (a group's members would swap each other out: the last
    one stays); a failure is logged and shown by the model's state (failed, with its error in
    ``/running`` and on the status page); serve keeps running."""
    for name in names:
        view = runtime.resolve(name)
        if view is None:  # a reload removed it meanwhile
            continue
        try:
            await runtime.wake(view)
            log.info("preloaded %s", view.name)
        except Exception as exc:
            log.error("preload of %s failed: %s", view.name, exc)


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
    from flexinfer import _compiled
    from flexinfer.http.server import run as serve_http
    from flexinfer.runtime.localconfig import DEFAULT_CONFIG, local_schema, startup_preload
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
        runtime, handler, watcher = build_watched(args.config, settings, max(0.0, args.watch_interval))
        preload_names = startup_preload(args.config)
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
    _compiled.log_start(log)
    log.info("flexinfer serve on http://%s:%d  models: %s (started on first request)",
             settings.host, settings.port, names)

    preloading: list[asyncio.Task[None]] = []

    async def on_start(_server: HTTPServer) -> None:
        watcher.start()
        if preload_names:  # hooks.on_startup.preload: in the background, the endpoint serves meanwhile
            preloading.append(asyncio.get_running_loop().create_task(preload(runtime, preload_names)))

    async def on_stop(_server: HTTPServer) -> None:
        for t in preloading:
            t.cancel()
        await watcher.close()
        await runtime.stop_all()

    return serve_http(lambda: handler, settings.http, host=settings.host, port=settings.port, workers=1,
                      on_start=on_start, on_stop=on_stop)
