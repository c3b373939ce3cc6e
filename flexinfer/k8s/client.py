"""The one way FlexInfer components open a Kubernetes API client (kubernetes_asyncio).

Owns: choosing the configuration, and :func:`kubeconfig_problem` (what is wrong with a kubeconfig
file, in words, before a command starts: a missing or unreadable file, bad YAML, no current
context), which commands call first so a broken file is one error line, not a traceback or a retry
loop. An explicit kubeconfig wins; otherwise the pod's service account;
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


def kubeconfig_problem(path: str | None) -> str | None:
    """What keeps the kubeconfig ``path`` (None: the one :func:`new_api_client` would fall back to
    outside a pod) from configuring a client, or None when it looks usable (or a pod's service
    account is used). Reads the file only; the server is not contacted."""
    import yaml

    if not path:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            return None  # in a pod: the service account
        path = (os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")).split(os.pathsep)[0]
        if not os.path.exists(path):
            return None  # nothing to check here: the client says what it found (tests use env configs)
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except OSError as exc:
        return f"kubeconfig {path}: {exc.strerror or exc}"
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        return f"kubeconfig {path}{where}: not YAML ({getattr(exc, 'problem', None) or exc})"
    if not isinstance(doc, dict):
        return f"kubeconfig {path}: not a kubeconfig (a mapping with clusters, users and contexts)"
    current = doc.get("current-context")
    if not current:
        return f"kubeconfig {path}: no current-context"
    names = [c.get("name") for c in doc.get("contexts") or () if isinstance(c, dict)]
    if current not in names:
        return f"kubeconfig {path}: current-context {current!r} is not among its contexts {names}"
    return None
