"""The one way FlexInfer components open a Kubernetes API client (kubernetes_asyncio).

Owns: choosing the configuration. An explicit kubeconfig wins; otherwise the pod's service account;
otherwise ``$KUBECONFIG`` (first path) or ``~/.kube/config``. ``$KUBECONFIG`` is read at call time,
not at import time as kubernetes_asyncio's default does, so tests and CLIs can point it anywhere
before calling.

Must not: make API requests, retry, or keep a client of its own (the caller owns and closes it);
``kubernetes_asyncio`` is imported only when a client is opened.
"""

from __future__ import annotations

import os
from typing import Any


async def new_api_client(kubeconfig: str | None = None) -> Any:
    """A ``kubernetes_asyncio.client.ApiClient``; the caller closes it."""
    from kubernetes_asyncio import client, config

    if not kubeconfig:
        cfg = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=cfg)
            return client.ApiClient(configuration=cfg)
        except config.ConfigException:
            pass
        kubeconfig = (os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")).split(os.pathsep)[0]
    return await config.new_client_from_config(config_file=kubeconfig)
