"""kopf wiring: one ``OperatorRegistry`` per operator, thin handlers that only route.

Owns:

- kopf settings (``configure_kopf``): progress in annotations under ``flexinfer.ai/``, the diff base
  in ``flexinfer.ai/last-handled-configuration`` over ``spec`` only (a label or annotation change is
  not a spec change: no handler runs and nothing is written), no Events from kopf itself (ours are
  explicit), kopf's own finalizer unused (each kind's finalizer is managed by its reconciler:
  ``flexinfer.ai/model-cleanup``, ``flexinfer.ai/lora-cleanup``, ``flexinfer.ai/cleanup``);
- the indices the read model is built on (every kind the reconcilers read; children filtered by
  ``app.kubernetes.io/managed-by=flexinfer``; PVCs unfiltered, a ``pvc://`` source is the user's);
- the watch handlers: each event refreshes the store overlay and triggers the reconciles it
  concerns (the owner of a child, the shared group of a Model, alias peers, adapters of a Model,
  ModelDeployments of a GPUGroup);
- Model spec changes also go through kopf change handlers (create/resume/update on ``spec``), which
  run the reconcile inline: an unusable spec raises ``kopf.PermanentError`` after its ``Failed``
  status is written (no crash loop); after an API failure the work queue retries the reconcile
  (``WorkQueue.run_now`` queues it), not kopf: kopf forgets a handler retry whose progress patch
  fails, and two retry owners would reconcile twice;
- Cluster and FederatedModel events route to ``cluster`` / ``federation`` (a Cluster event re-probes
  when its spec moved and wakes the FederatedModels of its namespace);
- startup (API client, writer, queues, Event poster, the metrics port) and cleanup (member clients too).

Every handler is ``async``: kopf runs plain functions in a thread pool, and these touch the event
loop's queues and the store.

Must not: contain reconcile logic.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import kopf

from flexinfer import labels
from flexinfer.k8s.client import new_api_client
from flexinfer.k8s.errors import KubeAPIError
from flexinfer.operator import catalog, gpugroup, lora, model, modelcache, modeldeployment
from flexinfer.operator import cluster as cluster_ctl
from flexinfer.operator import federation as federation_ctl
from flexinfer.operator.api_resources import (
    CLUSTER,
    CONFIGMAP,
    DEPLOYMENT,
    ENDPOINTS,
    FEDERATED_MODEL,
    GPU_GROUP,
    JOB,
    LORA,
    MODEL,
    MODEL_CACHE,
    MODEL_DEPLOYMENT,
    NODE,
    PVC,
    SERVICE,
    Kind,
)
from flexinfer.operator.context import CACHE_Q, GPUGROUP_Q, GROUP_Q, LORA_Q, MD_Q, MODEL_Q, Operator
from flexinfer.operator.controller import WorkQueue, Writer
from flexinfer.operator.kubeapi import KubeClient
from flexinfer.operator.model_logic import ALIAS_CONFLICT, claimed_names
from flexinfer.operator.results import Result

log = logging.getLogger("flexinfer.operator")
PREFIX = "flexinfer.ai"
MANAGED = {labels.MANAGED_BY: labels.MANAGED_BY_VALUE}
#: kind -> label filter of its index and watch (None: every object)
WATCHED: tuple[tuple[Kind, Mapping[str, str] | None], ...] = (
    (MODEL, None), (LORA, None), (MODEL_DEPLOYMENT, None), (MODEL_CACHE, None), (GPU_GROUP, None),
    (DEPLOYMENT, MANAGED), (SERVICE, MANAGED), (JOB, MANAGED), (CONFIGMAP, MANAGED), (ENDPOINTS, MANAGED),
    (PVC, None), (NODE, None),
    (CLUSTER, None), (FEDERATED_MODEL, None), (catalog.MODEL_CATALOG, None),
)


def configure_kopf(settings: kopf.OperatorSettings, op: Operator) -> None:
    """kopf settings for this operator (see the module docstring)."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration", ignored_fields=["metadata"])
    settings.persistence.finalizer = f"{PREFIX}/kopf-finalizer"
    # Under load the watch may lag kopf's own diff-base patch by seconds; waiting longer for it avoids
    # handling the same creation twice (an idempotent but useless second write).
    settings.persistence.consistency_timeout = 15.0
    settings.posting.enabled = False
    settings.networking.request_timeout = op.settings.request_timeout_s
    settings.networking.connect_timeout = min(10.0, op.settings.request_timeout_s)
    # kopf gives up a request (watch, discovery, its own patches) after len(error_backoffs) retries, and
    # a failed discovery scan stops the whole operator: 3 retries died under a 30 % error rate (F19).
    # 10 retries as kopf's default has, doubling from retry_base_s up to retry_max_s.
    settings.networking.error_backoffs = [min(op.settings.retry_base_s * 2**i, op.settings.retry_max_s)
                                          for i in range(10)]
    settings.watching.server_timeout = 600
    settings.watching.client_timeout = 660
    # kopf renamed ``batching`` to ``queueing`` (the old name warns); an older kopf has only ``batching``
    queueing = settings.queueing if hasattr(settings, "queueing") else settings.batching
    queueing.worker_limit = 1000


def _md(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("metadata") or {}


def _key(body: Mapping[str, Any]) -> tuple[str, str]:
    return str(_md(body).get("namespace") or "default"), str(_md(body).get("name"))


# ---- routing -------------------------------------------------------------------------------------------

def route_model(op: Operator, body: Mapping[str, Any], deleted: bool) -> None:
    ns, name = _key(body)
    op.trigger(MODEL_Q, (ns, name))
    group = model.shared_group_of(body)
    if group:
        op.trigger(GROUP_Q, (ns, group))
    old_group = ((body.get("status") or {}).get("sharedGroup") or {}).get("groupName")
    if old_group and old_group != group:
        op.trigger(GROUP_Q, (ns, old_group))
    gen = _md(body).get("generation")
    if not deleted and op.model_generations.get((ns, name)) == gen:
        pass  # a status or metadata change: claims did not move, peers need no look
    else:
        if deleted:
            op.model_generations.pop((ns, name), None)
        else:
            op.model_generations[(ns, name)] = gen
        route_alias_peers(op, body, ns, name)
    for name_ in lora.adapters_of(op.store.list(LORA, ns), name):
        op.trigger(LORA_Q, (ns, name_))


def route_alias_peers(op: Operator, body: Mapping[str, Any], ns: str, name: str) -> None:
    """Wake the Models whose alias conflicts a spec change of ``name`` may start or end."""
    own = claimed_names(body.get("spec"))
    for peer in op.store.list(MODEL, ns):
        pn = str(_md(peer).get("name"))
        if pn == name:
            continue
        conflicted = any(c.get("reason") == ALIAS_CONFLICT for c in (peer.get("status") or {}).get("conditions") or ())
        if conflicted or (own and (own & claimed_names(peer.get("spec")) or pn in own)) \
                or name in claimed_names(peer.get("spec")):
            op.trigger(MODEL_Q, (ns, pn))


def route_child(op: Operator, kind: Kind, body: Mapping[str, Any], deleted: bool) -> None:
    ns, name = _key(body)
    lbl = _md(body).get("labels") or {}
    app, inst = lbl.get(labels.APP_NAME), lbl.get(labels.APP_INSTANCE)
    if app == "model" and lbl.get(labels.MODEL):
        op.trigger(MODEL_Q, (ns, lbl[labels.MODEL]))
    elif app == modeldeployment.APP and inst:
        op.trigger(MD_Q, (ns, inst))
    elif app == modelcache.APP and inst:
        op.trigger(CACHE_Q, (ns, inst))
    if kind is CONFIGMAP and name.endswith(labels.BENCHMARK_CONFIGMAP_SUFFIX):
        op.trigger(MD_Q, (ns, name[: -len(labels.BENCHMARK_CONFIGMAP_SUFFIX)]))
    if kind is ENDPOINTS:
        for a in lora.adapters_of(op.store.list(LORA, ns), name):
            op.trigger(LORA_Q, (ns, a))
    if kind is PVC and not app:  # a user's claim: Models reading it as a pvc:// source
        for mb in op.store.list(MODEL, ns):
            if str((mb.get("spec") or {}).get("source", "")).startswith(f"pvc://{name}"):
                op.trigger(MODEL_Q, (ns, str(_md(mb).get("name"))))


def route(op: Operator, kind: Kind, body: Mapping[str, Any], deleted: bool) -> None:
    """React to one watch event of ``kind`` (the index already has it)."""
    if op.store.seen(kind, body, deleted):
        return  # the echo of our own create: nothing new
    ns, name = _key(body)
    if kind is catalog.MODEL_CATALOG:
        op.trigger(catalog.CATALOG_Q, (ns, name))
        return
    if kind is MODEL:
        route_model(op, body, deleted)
    elif kind is LORA:
        op.trigger(LORA_Q, (ns, name))
        ref = (body.get("spec") or {}).get("modelRef")
        if ref:
            op.trigger(MODEL_Q, (ns, str(ref)))
    elif kind is MODEL_DEPLOYMENT:
        op.trigger(MD_Q, (ns, name))
        ref = (body.get("spec") or {}).get("gpuGroupRef")
        if ref:
            op.trigger(GPUGROUP_Q, (ns, str(ref)))
    elif kind is MODEL_CACHE:
        op.trigger(CACHE_Q, (ns, name))
    elif kind is GPU_GROUP:
        op.trigger(GPUGROUP_Q, (ns, name))
    elif kind is CLUSTER:
        cluster_ctl.route_cluster(op, body, deleted)
    elif kind is FEDERATED_MODEL:
        op.trigger(federation_ctl.QUEUE, (ns, name))
    elif kind is not NODE:
        route_child(op, kind, body, deleted)


# ---- the registry -----------------------------------------------------------------------------------------

def index_id(kind: Kind, by_namespace: bool = False) -> str:
    return f"idx_{kind.plural}_ns" if by_namespace else f"idx_{kind.plural}"


def _reconcilers(op: Operator) -> dict[str, Callable[[Any], Any]]:
    return {MODEL_Q: partial(model.reconcile_model, op), GROUP_Q: partial(model.reconcile_group, op),
            LORA_Q: partial(lora.reconcile_lora, op), MD_Q: partial(modeldeployment.reconcile_md, op),
            CACHE_Q: partial(modelcache.reconcile_modelcache, op),
            GPUGROUP_Q: partial(gpugroup.reconcile_gpugroup, op),
            cluster_ctl.QUEUE: partial(cluster_ctl.reconcile_cluster, op),
            federation_ctl.QUEUE: partial(federation_ctl.reconcile_federated, op),
            catalog.CATALOG_Q: partial(catalog.reconcile_catalog, op, catalog.Syncer())}


async def start(op: Operator, indices: Mapping[str, Any], kubeconfig: str | None = None) -> None:
    """Bind the indices, open the API client, start the Event poster and the queues."""
    for kind, _ in WATCHED:
        op.store.bind(kind, indices[index_id(kind)], indices[index_id(kind, True)])
    if op.kube is None:
        api = await new_api_client(kubeconfig)
        op.kube = KubeClient(api, timeout_s=op.settings.request_timeout_s, retries=op.settings.api_retries,
                             backoff_s=min(1.0, op.settings.retry_base_s))
    if op.kube.on_error is None:
        op.kube.on_error = op.metrics.api_error
    op.metrics.bind_queues(lambda: op.queues)
    op.writer = Writer(op.kube, op.store)
    op.events.kube = op.kube
    op.events.start()
    s = op.settings
    for name, fn in _reconcilers(op).items():
        if name not in op.queues:
            op.queues[name] = WorkQueue(name, fn, workers=s.workers, retry_base_s=s.retry_base_s,
                                        retry_max_s=s.retry_max_s, metrics=op.metrics)
        op.queues[name].start()
    if s.metrics_port and op.metrics_server is None:
        await start_metrics(op)


async def start_metrics(op: Operator) -> None:
    """Serve ``/metrics`` on ``settings.metrics_port`` with the HTTP core; a port that cannot be bound is
    logged and the operator runs on without it (metrics are not worth a crash loop)."""
    from flexinfer.http.server import HTTPServer
    from flexinfer.operator.metrics import MetricsHandler
    from flexinfer.settings import HTTPSettings

    s = op.settings
    server = HTTPServer(MetricsHandler(op.metrics), HTTPSettings(), host=s.metrics_host, port=s.metrics_port)
    try:
        await server.start()
    except OSError as e:
        log.error("metrics port %s:%d not served: %s", s.metrics_host, s.metrics_port, e)
        return
    op.metrics_server = server
    log.info("operator metrics on http://%s:%d/metrics", s.metrics_host, server.port)


async def stop(op: Operator) -> None:
    if op.metrics_server is not None:
        await op.metrics_server.drain_and_close(1.0)
        op.metrics_server = None
    for q in op.queues.values():
        await q.stop()
    if op.members is not None:
        await op.members.close()
    await op.events.stop()
    if op.kube is not None:
        await op.kube.close()
        op.kube = None


def build_registry(op: Operator, *, kubeconfig: str | None = None) -> kopf.OperatorRegistry:
    """A kopf registry wired to ``op`` (fresh per operator run; nothing global)."""
    reg = kopf.OperatorRegistry()

    @kopf.on.login(registry=reg)
    def login(**kw: Any) -> Any:
        return kopf.login_with_service_account(**kw) or kopf.login_with_kubeconfig(**kw)

    @kopf.on.startup(registry=reg)
    async def on_startup(settings: kopf.OperatorSettings, **kw: Any) -> None:
        configure_kopf(settings, op)
        await start(op, kw, kubeconfig)

    @kopf.on.cleanup(registry=reg)
    async def on_cleanup(**_: Any) -> None:
        await stop(op)

    for kind, flt in WATCHED:
        async def indexer(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
            return {(namespace or "", name): dict(body)}

        async def ns_indexer(namespace: str | None, body: kopf.Body, **_: Any) -> dict[Any, Any]:
            return {namespace or "": dict(body)}

        kopf.index(group=kind.group, version=kind.version, plural=kind.plural, id=index_id(kind), labels=flt,
                   registry=reg)(indexer)
        kopf.index(group=kind.group, version=kind.version, plural=kind.plural, id=index_id(kind, True),
                   labels=flt, registry=reg)(ns_indexer)

        async def on_event(type: str | None, body: kopf.Body, _kind: Kind = kind, **_: Any) -> None:
            route(op, _kind, dict(body), type == "DELETED")

        kopf.on.event(group=kind.group, version=kind.version, plural=kind.plural, id=f"route_{kind.plural}",
                      labels=flt, registry=reg)(on_event)

    async def model_changed(*, namespace: str | None, name: str, **_: Any) -> None:
        try:
            result: Result = await op.queues[MODEL_Q].run_now((namespace or "default", name))
        except KubeAPIError as e:
            # the work queue has queued the retry (run_now): a kopf retry as well would reconcile twice
            # and write kopf's progress annotation on every failure (F19)
            log.info("model %s/%s: %s; the work queue retries it", namespace, name, e)
            return
        if result.permanent:
            raise kopf.PermanentError(result.permanent)

    g, v, p, backoff = MODEL.group, MODEL.version, MODEL.plural, op.settings.retry_base_s
    kopf.on.resume(group=g, version=v, plural=p, id="model-resume", registry=reg, backoff=backoff)(model_changed)
    kopf.on.create(group=g, version=v, plural=p, id="model-create", registry=reg, backoff=backoff)(model_changed)
    kopf.on.update(group=g, version=v, plural=p, id="model-update", field="spec", registry=reg,
                   backoff=backoff)(model_changed)
    return reg
