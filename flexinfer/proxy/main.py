"""``flexinfer proxy``: run the OpenAI-compatible proxy in front of a static inventory file.

(The local runtime is ``flexinfer serve``; the Kubernetes inventory is ``--kube``.)
"""

from __future__ import annotations

import argparse
import logging
import sys

from flexinfer.settings import SettingsError, load_proxy_settings

log = logging.getLogger("flexinfer.proxy")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", help="static inventory YAML (models -> backend URLs)")
    p.add_argument("--host", default=None, help="listen address (env PROXY_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="listen port (env PROXY_PORT, default 8080)")
    p.add_argument("--workers", type=int, default=None, help="worker processes sharing the port")


def run(args: argparse.Namespace) -> int:
    from flexinfer.http.server import run as serve_http
    from flexinfer.proxy.pipeline import ProxyHandler
    from flexinfer.runtime.static import InventoryConfigError, StaticInventory

    try:
        settings = load_proxy_settings(host=args.host, port=args.port, workers=args.workers)
    except SettingsError as exc:
        print(f"flexinfer proxy: {exc}", file=sys.stderr)
        return 2
    if not args.config:
        print("flexinfer proxy: -c/--config <inventory.yaml> is required", file=sys.stderr)
        return 2
    try:
        inventory = StaticInventory.from_file(args.config)
    except InventoryConfigError as exc:
        print(f"flexinfer proxy: {exc}", file=sys.stderr)
        return 2
    names = ", ".join(v.name for v in inventory.models())
    from flexinfer import _speedups

    log.info("speedups: %s", _speedups.IMPLEMENTATION)
    log.info("flexinfer proxy on http://%s:%d serving %s", settings.host, settings.port, names)
    return serve_http(lambda: ProxyHandler(inventory, settings), settings.http, host=settings.host,
                      port=settings.port, workers=settings.workers)
