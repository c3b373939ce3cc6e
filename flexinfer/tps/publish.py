"""Publishing bench results in a cluster: the per-deployment ConfigMap and the global
``bench_<hash>`` / ``meta_<hash>`` keys the scheduler extender reads (3 tries on 409 conflicts).

Part of the bench runner (:mod:`flexinfer.tps`; :mod:`flexinfer.tps.measure` measures);
``kubernetes_asyncio`` is imported only inside :func:`publish` when no API object is given.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from flexinfer import labels
from flexinfer.tps.config import BenchConfig, BenchError
from flexinfer.tps.stats import BenchResult

log = logging.getLogger("flexinfer.tps")


# ---- cluster: ConfigMaps -------------------------------------------------------------------------

class Conflict(Exception):
    """409 from the API server (stale resourceVersion, or created concurrently)."""


class ConfigMapAPI(Protocol):
    """What the writer needs from Kubernetes; the real one wraps kubernetes_asyncio's CoreV1Api."""

    async def read(self, namespace: str, name: str) -> tuple[dict[str, str], str] | None:
        """(data, resourceVersion), or None when missing."""

    async def create(self, namespace: str, name: str, data: dict[str, str]) -> None:
        """Raises Conflict when it already exists."""

    async def update(self, namespace: str, name: str, data: dict[str, str], resource_version: str) -> None:
        """Write ``data`` as the whole data map if still at ``resource_version``; Conflict if not."""


def deployment_data(result: BenchResult) -> dict[str, str]:
    """The per-deployment ConfigMap (string values; the original's field names)."""
    return {
        "tokensPerSecond": f"{result.tokens_per_second:.2f}",
        "model": result.model,
        "backend": result.backend,
        "iterations": str(result.iterations),
        "batchSize": "1",
        "completionTokens": str(result.completion_tokens),
        "durationSeconds": f"{result.duration_seconds:.2f}",
        "samples": json.dumps([round(s.tokens_per_second, 2) for s in result.samples]),
        "timestamp": result.timestamp,
    }


def global_entries(result: BenchResult, device_class: str) -> dict[str, str]:
    """``bench_<hash>`` (tokens/s) and ``meta_<hash>`` (JSON) for the global ConfigMap."""
    meta = {"model": result.model, "backend": result.backend, "deviceClass": device_class,
            "tokensPerSecond": round(result.tokens_per_second, 2), "iterations": result.iterations,
            "completionTokens": result.completion_tokens, "ttftP50Seconds": result.ttft_p50,
            "latencyP50Seconds": round(result.latency(50), 4), "timestamp": result.timestamp}
    return {labels.bench_key(result.backend, result.model, device_class): f"{result.tokens_per_second:.2f}",
            labels.meta_key(result.backend, result.model, device_class): json.dumps(meta, sort_keys=True)}


def merge_data(existing: Mapping[str, str] | None, new: Mapping[str, str]) -> dict[str, str]:
    """Keys written by others are kept; ours are replaced."""
    return {**(existing or {}), **new}


async def upsert_configmap(api: ConfigMapAPI, namespace: str, name: str, data: Mapping[str, str],
                           tries: int = 3) -> int:
    """Create the ConfigMap or merge ``data`` into it, re-reading and retrying on 409 (``tries`` in
    all). Returns the attempt that succeeded; raises BenchError when every attempt conflicted."""
    for attempt in range(1, tries + 1):
        current = await api.read(namespace, name)
        try:
            if current is None:
                await api.create(namespace, name, dict(data))
            else:
                await api.update(namespace, name, merge_data(current[0], data), current[1])
            return attempt
        except Conflict:
            log.info("ConfigMap %s/%s changed under us (attempt %d/%d); re-reading", namespace, name,
                     attempt, tries)
    raise BenchError(f"ConfigMap {namespace}/{name}: conflict on each of {tries} attempts")


class KubeConfigMaps:
    """ConfigMapAPI over kubernetes_asyncio. Update is a merge patch carrying ``resourceVersion``,
    which the API server checks (409 when stale) — a PUT without the PUT verb's full-object hazards."""

    def __init__(self, core: Any) -> None:
        self.core = core

    async def read(self, namespace: str, name: str) -> tuple[dict[str, str], str] | None:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            cm = await self.core.read_namespaced_config_map(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(cm.data or {}), str(cm.metadata.resource_version or "")

    async def create(self, namespace: str, name: str, data: dict[str, str]) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
                                        labels.APP_COMPONENT: "benchmark"}},
                "data": data}
        try:
            await self.core.create_namespaced_config_map(namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(str(exc.reason)) from None
            raise

    async def update(self, namespace: str, name: str, data: dict[str, str], resource_version: str) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        meta: dict[str, Any] = {"resourceVersion": resource_version} if resource_version else {}
        try:
            await self.core.patch_namespaced_config_map(name, namespace, {"metadata": meta, "data": data},
                                                        _content_type="application/merge-patch+json")
        except ApiException as exc:
            if exc.status in (404, 409):  # 404: deleted meanwhile -> re-read creates it
                raise Conflict(str(exc.reason)) from None
            raise


async def publish(result: BenchResult, cfg: BenchConfig, api: ConfigMapAPI | None = None,
                  node_labels: Mapping[str, str] | None = None) -> dict[str, str]:
    """Write the per-deployment and global ConfigMaps; returns the global entries written.
    Without ``api`` it connects with kubernetes_asyncio (in-cluster config, else kubeconfig)."""
    namespace = cfg.namespace or _service_account_namespace() or "default"
    if api is None:
        try:
            from kubernetes_asyncio import client
        except ImportError:
            raise BenchError("--configmap needs kubernetes_asyncio: pip install 'flexinfer[kube]'") from None
        from flexinfer.k8s.client import new_api_client

        async with await new_api_client(cfg.kubeconfig or None) as api_client:
            core = client.CoreV1Api(api_client)
            if node_labels is None and not cfg.device_class and cfg.node_name:
                node = await core.read_node(cfg.node_name)
                node_labels = dict(node.metadata.labels or {})
            return await publish(result, cfg, KubeConfigMaps(core), node_labels)
    device = cfg.device_class or (labels.device_class_from_labels(node_labels) if node_labels else "")
    if not device:
        log.warning("no device class (--device-class, or NODE_NAME with gpu.* labels): the extender "
                    "will not match this result to a node")
    if not result.backend:
        log.warning("no backend name (--backend): keys use an empty backend")
    await upsert_configmap(api, namespace, cfg.configmap, deployment_data(result))
    entries = global_entries(result, device)
    await upsert_configmap(api, namespace, cfg.global_configmap, entries)
    return entries


def _service_account_namespace() -> str:
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace", encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError:
        return ""
