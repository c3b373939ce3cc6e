"""``flexinfer extender``: the kube-scheduler extender process.

Reads its settings once (``SCHED_*`` and the HTTP core's ``PROXY_*`` limits), starts the node /
ConfigMap (/ Pod) watches when the listener is up, serves on ``--port`` (8082, as the original chart
configures) and drains on SIGTERM. Kubernetes access: ``--kubeconfig``, else in-cluster, else the
default kubeconfig.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
from typing import Any

from flexinfer.k8s.client import new_api_client
from flexinfer.scheduler.memory import tune_malloc
from flexinfer.scheduler.server import ExtenderHandler, make_app
from flexinfer.scheduler.settings import load_extender_settings

log = logging.getLogger(__name__)

MiB = 1024 * 1024


def configure(parser: argparse.ArgumentParser) -> None:
    """Flags of ``flexinfer extender``."""
    parser.add_argument("--host", default="0.0.0.0", help="listen address (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8082, help="listen port (default 8082)")
    parser.add_argument("--namespace", default="",
                        help="namespace of the benchmark ConfigMaps; empty = watch every namespace and use "
                             "the pod's (default: every namespace)")
    parser.add_argument("--kubeconfig", default=None,
                        help="kubeconfig file (default: in-cluster config, else $KUBECONFIG/~/.kube/config)")
    parser.add_argument("--watch-timeout", type=int, default=300,
                        help="server-side timeout of each watch request in seconds, spread x1-2 like "
                             "client-go (default 300)")
    parser.add_argument("--max-body-mb", type=int, default=32,
                        help="largest request body in MiB (full NodeLists are big; default 32)")


async def _freeze_when_synced(watchers: list[Any]) -> None:
    """Once the inventory is loaded, move the long-lived heap out of the cyclic GC's way, so that a
    full collection does not walk thousands of node facts in the middle of a request."""
    await asyncio.gather(*(w.synced.wait() for w in watchers))
    gc.collect()
    gc.freeze()
    log.info("inventory synced; %d objects frozen", gc.get_freeze_count())


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit code."""
    from flexinfer.http.server import run as http_run
    from flexinfer.k8s.client import kubeconfig_problem
    from flexinfer.settings import HTTPSettings, from_env

    if (why := kubeconfig_problem(args.kubeconfig)) is not None:
        log.error("extender: %s", why)
        return 2
    settings = load_extender_settings()
    app = make_app(settings, args.namespace)
    http_settings = from_env(HTTPSettings, max_body_json=args.max_body_mb * MiB)
    tune_malloc(http_settings.max_body_json)  # 20 MiB NodeList bodies reuse warm heap (memory.py)
    state: dict[str, Any] = {}

    async def on_start(server: Any) -> None:
        api = await new_api_client(args.kubeconfig)
        state["api"] = api
        watchers = app.inventory.make_watchers(api, on_restart=app.metrics.on_restart,
                                               timeout_seconds=args.watch_timeout)
        state["tasks"] = [asyncio.create_task(w.run(), name=f"watch-{w.kind}") for w in watchers]
        state["tasks"].append(asyncio.create_task(_freeze_when_synced(watchers), name="gc-freeze"))
        log.info("extender listening on %s:%d (namespace %r, %d watches)", args.host, server.port,
                 args.namespace or "*", len(watchers))

    async def on_stop(server: Any) -> None:
        tasks = state.get("tasks", [])
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if "api" in state:
            await state["api"].close()

    return http_run(lambda: ExtenderHandler(app), http_settings, host=args.host, port=args.port,
                    on_start=on_start, on_stop=on_stop)
