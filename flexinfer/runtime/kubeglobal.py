"""The global proxy's configuration from the hub cluster, and its status written back
(``flexinfer proxy --global --kube``, docs/globalproxy.md).

Every probe interval (the GlobalProxy's ``probe.interval``, at most :data:`MAX_SYNC_S`) the
``GlobalProxy`` named ``--global-name`` (or the only one of the namespace) and the namespace's
``FederatedModel`` objects are read (GET and LIST: two requests, no watch), given to the
:class:`~flexinfer.runtime.globalrt.GlobalRuntime`, and after each probe round the GlobalProxy's
status (``healthyClusters``, ``totalClusters``, ``activeCluster``, a ``Ready`` condition whose
message lists every cluster) is merge-patched when it changed: zero writes in a steady state.

With ``spec.tls.secretRef`` the Secret (namespace of the GlobalProxy) is read at each sync too
(a GET; Secrets are never watched) and its ``ca.crt`` / ``tls.crt`` / ``tls.key`` given to the
members' https links (``runtime.globaltls``). A missing, unreadable or invalid Secret keeps the
last good material (or none) and is the ``TLSReady`` condition's reason (``SecretNotFound``,
``SecretForbidden``, ``SecretUnreadable``, ``InvalidCertificate``); a fixed Secret is taken at
the next sync, without a restart.

The global proxy writes that status itself, not the operator: the status says which clusters
*this proxy* can reach (its network path, its probes), which only the proxy knows; an operator
probing from elsewhere could report a cluster healthy that the proxy cannot reach.

Owns: :class:`KubeGlobalSource`. Must not: probe members (the runtime does) or write anything but
the GlobalProxy's status.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from flexinfer.api import GROUP
from flexinfer.api.conditions import Condition, conditions_to_list, parse_conditions, set_condition
from flexinfer.api.federation import FEDERATED_MODEL, GLOBAL_PROXY
from flexinfer.k8s.customobjects import (
    API_ERRORS,
    MERGE_PATCH,
    custom_objects,
    is_transport_error,
    read_secret,
)
from flexinfer.runtime.globalrt import GlobalConfigError, GlobalRuntime, parse_global
from flexinfer.runtime.globaltls import TLSMaterialError, TLSStore, secret_pem

__all__ = ["MAX_SYNC_S", "KubeGlobalSource"]

log = logging.getLogger("flexinfer.proxy.global")
MAX_SYNC_S = 30.0


class KubeGlobalSource:
    """Reads the GlobalProxy (+ FederatedModels) into ``runtime`` and writes its status back."""

    def __init__(self, runtime: GlobalRuntime, api_client: Any, namespace: str, name: str | None = None,
                 *, request_timeout: float = 10.0) -> None:
        self.runtime = runtime
        self.api = custom_objects(api_client)
        self.namespace = namespace
        self.name = name
        self.request_timeout = request_timeout
        self.error: str | None = None  # why the last read failed (None: it worked)
        self.status_writes = 0
        self._obj: dict[str, Any] | None = None
        self._written: dict[str, Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._pending: asyncio.Task[None] | None = None
        self._writing = asyncio.Lock()  # one status write at a time: the next compares with it
        self.tls = TLSStore()
        self.tls_condition: tuple[str, str, str] | None = None  # (status, reason, message); None: no secretRef
        self._api_client = api_client
        runtime.on_round.append(self._after_round)

    async def start(self) -> None:
        await self.sync()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="global-kube-sync")

    async def stop(self) -> None:
        for t in (self._task, self._pending):
            if t is not None:
                t.cancel()
                try:
                    await t
                except asyncio.CancelledError:
                    pass
        self._task = self._pending = None
        self.tls.close()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(min(MAX_SYNC_S, self.runtime.config.spec.probe_interval_s))
            await self.sync()

    async def _named(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"_request_timeout": self.request_timeout}
        if self.name is not None:
            obj: dict[str, Any] = await self.api.get_namespaced_custom_object(
                GROUP, GLOBAL_PROXY.version, self.namespace, GLOBAL_PROXY.plural, self.name, **kw)
            return obj
        listed = await self.api.list_namespaced_custom_object(GROUP, GLOBAL_PROXY.version, self.namespace,
                                                              GLOBAL_PROXY.plural, **kw)
        items = listed.get("items") or []
        if len(items) != 1:
            raise GlobalConfigError(f"{len(items)} GlobalProxy objects in namespace {self.namespace}: "
                                    "name one with --global-name")
        only: dict[str, Any] = items[0]
        return only

    async def sync(self) -> None:
        """Read the resources once; a failure keeps the last configuration (and says why)."""
        try:
            obj = await self._named()
            fms = await self.api.list_namespaced_custom_object(
                GROUP, FEDERATED_MODEL.version, self.namespace, FEDERATED_MODEL.plural,
                _request_timeout=self.request_timeout)
        except (*API_ERRORS, GlobalConfigError) as exc:  # type: ignore[misc]
            self._failed(f"reading the GlobalProxy: {getattr(exc, 'reason', None) or exc}")
            return
        docs = [obj]
        for fm in fms.get("items") or []:  # an invalid FederatedModel is skipped, not fatal
            try:
                parse_global([obj, fm], strict=False)
                docs.append(fm)
            except GlobalConfigError as exc:
                log.warning("global proxy: FederatedModel skipped: %s", exc)
        try:
            cfg = parse_global(docs, f"GlobalProxy {self.namespace}/{obj['metadata']['name']}", strict=False)
        except GlobalConfigError as exc:
            self._failed(str(exc))
            return
        self._obj, self.error = obj, None
        self.name = self.name or cfg.name
        if cfg.spec.tls_secret_name:
            await self._read_tls(cfg.spec.tls_secret_name)
        else:
            self.tls_condition = None
        cfg = replace(cfg, tls=self.tls.files if cfg.spec.tls_secret_name else None)
        old = self.runtime.config
        if (cfg.spec, dict(cfg.routing), cfg.generation, cfg.tls) != (old.spec, dict(old.routing), old.generation,
                                                                     old.tls):
            self.runtime.configure(cfg)
            log.info("global proxy: configuration of GlobalProxy %s taken (%d clusters)", cfg.name,
                     len(cfg.spec.clusters))

    async def _read_tls(self, secret: str) -> None:
        """Read the TLS Secret into :attr:`tls`; a failure keeps the last good material."""
        where = f"Secret {self.namespace}/{secret}"
        try:
            body = await read_secret(self._api_client, self.namespace, secret, request_timeout=self.request_timeout)
            self.tls.take(secret_pem(body))
        except TLSMaterialError as exc:
            cond = ("False", exc.reason, f"{where}: {exc}")
        except API_ERRORS as exc:
            status = getattr(exc, "status", None)
            reason = {404: "SecretNotFound", 403: "SecretForbidden"}.get(status or 0, "SecretUnreadable")
            detail = "not found" if status == 404 else f"cannot be read: {getattr(exc, 'reason', None) or exc}"
            cond = ("False", reason, f"{where} {detail}")
        else:
            cond = ("True", "SecretLoaded", f"{where}: {self.tls.summary}")
        if cond[0] == "False":
            kept = " (the last good TLS material stays in use)" if self.tls.files is not None else ""
            cond = (cond[0], cond[1], cond[2] + kept)
            if cond != self.tls_condition:
                log.warning("global proxy: TLS: %s", cond[2])
        elif cond != self.tls_condition:
            log.info("global proxy: TLS: %s", cond[2])
        self.tls_condition = cond

    def _failed(self, why: str) -> None:
        if why != self.error:
            log.warning("global proxy: %s (the last configuration stays)", why)
        self.error = why

    # -- status ----------------------------------------------------------------------------------
    def _after_round(self) -> None:
        if self._obj is None or (self._pending is not None and not self._pending.done()):
            return
        self._pending = asyncio.get_running_loop().create_task(self.write_status(), name="global-status")

    def desired_status(self) -> dict[str, Any]:
        assert self._obj is not None
        new = self.runtime.status()
        current = parse_conditions((self._obj.get("status") or {}).get("conditions"))
        now = datetime.now(UTC).replace(microsecond=0)
        conds: tuple[Condition, ...] = current
        if self.tls_condition is None:  # no secretRef (any more): no TLSReady
            conds = tuple(c for c in conds if c.type != "TLSReady")
        extra = [] if self.tls_condition is None else [
            {"type": "TLSReady", "status": self.tls_condition[0], "reason": self.tls_condition[1],
             "message": self.tls_condition[2][:4096]}]
        for c in [*new.pop("conditions"), *extra]:
            conds = set_condition(conds, Condition(c["type"], c["status"], c["reason"], c["message"],
                                                   observed_generation=new.get("observedGeneration")), now)
        new["conditions"] = conditions_to_list(conds)
        return new

    async def write_status(self) -> None:
        """Merge-patch the status when it differs from the last one written (or read)."""
        async with self._writing:
            await self._write_status()

    async def _write_status(self) -> None:
        if self._obj is None or self.name is None:
            return
        status = self.desired_status()
        have = self._written if self._written is not None else (self._obj.get("status") or {})
        if _same(status, have):
            return
        patch: Any = self.api.patch_namespaced_custom_object_status
        for attempt in (1, 2):  # once more after a transport error (a keep-alive the server closed)
            try:
                got = await patch(
                    GROUP, GLOBAL_PROXY.version, self.namespace, GLOBAL_PROXY.plural, self.name,
                    {"status": status}, _content_type=MERGE_PATCH, _request_timeout=self.request_timeout)
                break
            except API_ERRORS as exc:
                if attempt == 1 and is_transport_error(exc):
                    continue
                why: Any = getattr(exc, "reason", None) or exc
            log.warning("global proxy: writing the status of %s failed: %s (next round retries)", self.name, why)
            return
        self.status_writes += 1
        self._written = status
        if isinstance(got, dict):
            self._obj = got


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal but for the conditions' transition times (kept by ``set_condition`` anyway)."""
    def strip(s: dict[str, Any]) -> dict[str, Any]:
        return {**s, "conditions": [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                                    for c in s.get("conditions") or ()]}
    return strip(a) == strip(b)
