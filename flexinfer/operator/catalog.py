"""ModelCatalog (v1alpha2): list the models of OCI, Hugging Face and Ollama registries into status.

Owns: ``reconcile_catalog`` and its pure parts (``matches``, ``belongs``, ``plan_status``), the
``Syncer`` (when each catalog is due, the HTTP session of a sync, the bounds), and reading each
registry's Secret (``credentials``).

- **When**: a catalog syncs when its spec changed (``metadata.generation``; also the first time the
  operator sees it) and then every ``spec.syncInterval``; other events (our own status write) do
  not make it sync again. Registries are listed concurrently, each within ``registry_timeout_s``.
- **Filter**: ``filter.namePattern`` is a glob over the entry name, case-insensitive
  (``*instruct*`` matches ``Qwen/Qwen2.5-0.5B-Instruct-GGUF``), applied before any manifest is
  fetched; ``filter.tags`` must all be among the entry's tags (case-insensitive; the Hub's tags, the
  OCI ``ai.flexinfer.model.tags`` annotation, the OCI tag, the format).
- **Bounded status**: ``entries`` keeps at most ``max_entries`` (1000) entries and ``max_bytes``
  (256 KiB of JSON), in the order of ``spec.registries`` then by name; ``totalModels`` counts every
  model that matched and ``truncated`` says when entries were left out (or a registry was cut off
  at its page bound). One object, one status write, readable by ``kubectl get -o yaml``, far below
  etcd's 1.5 MiB, whatever the registry holds; a catalog of thousands is narrowed by its filter.
- **Failures**: each registry has a condition ``Registry<i>Synced`` (``i`` its index in
  ``spec.registries``) with the reason (``Unreachable``, ``Unauthorized``, ``Forbidden``,
  ``NotFound``, ``Timeout``, ``BadResponse``, ``RateLimited``, ``SecretNotFound``,
  ``InvalidCredentials``, ...); the other registries still sync, and a failing registry keeps the
  entries it had at its last good sync. ``Ready`` is True when every registry synced
  (``Synced``), else False (``RegistryFailed``, or ``SyncFailed`` when none did).
- **Zero writes on a steady state**: the status is compared field by field (``diff.merge_patch``);
  an unchanged sync sends no PATCH, so ``lastSyncTime`` is the time of the last sync that changed
  the status.

Must not: hold protocol details of the registries (``flexinfer.operator.registries``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import fnmatch
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import aiohttp

from flexinfer import labels
from flexinfer.api import SpecError
from flexinfer.api.catalog import CatalogRegistry, ModelCatalog
from flexinfer.api.common import format_time
from flexinfer.api.conditions import READY, ConditionSet, ConditionStatus
from flexinfer.k8s.errors import KubeAPIError
from flexinfer.operator.api_resources import Kind
from flexinfer.operator.context import Operator
from flexinfer.operator.diff import merge_patch
from flexinfer.operator.registries import Credentials, Found, RegistryError, RegistryHTTP
from flexinfer.operator.registries.hub import list_hf, list_ollama
from flexinfer.operator.registries.oci import list_oci, split_url
from flexinfer.operator.results import Event, Result

log = logging.getLogger("flexinfer.operator.catalog")
MODEL_CATALOG = Kind(labels.API_GROUP, "v1alpha2", "modelcatalogs", "ModelCatalog")
SECRET = Kind("", "v1", "secrets", "Secret")
CATALOG_Q = "modelcatalog"
MAX_ENTRIES = 1000
MAX_STATUS_BYTES = 256 * 1024
Key = tuple[str, str]


def registry_condition(i: int) -> str:
    return f"Registry{i}Synced"


def describe_registry(r: CatalogRegistry) -> str:
    return f"{r.type} {r.url}" if r.url else r.type


# ---- pure parts ----------------------------------------------------------------------------------


def name_filter(pattern: str | None) -> Callable[[str], bool]:
    if not pattern:
        return lambda _name: True
    pat = pattern.lower()
    return lambda name: fnmatch.fnmatchcase(name.lower(), pat)


def matches(found: Found, tags: Sequence[str], pattern: str | None) -> bool:
    have = {t.lower() for t in found.tags}
    return all(t.lower() in have for t in tags) and name_filter(pattern)(found.name)


def belongs(entry: Mapping[str, Any], reg: CatalogRegistry) -> bool:
    """Whether an entry of an earlier status came from ``reg`` (kept while ``reg`` fails)."""
    if entry.get("registry") != reg.type:
        return False
    if reg.type != "OCI" or not reg.url:
        return True
    try:
        _, host, prefix = split_url(reg.url)
    except RegistryError:
        return False
    base = f"oci://{host}/{prefix}".rstrip("/")
    ref = str(entry.get("reference", ""))
    return ref.startswith(base + "/") or ref.startswith(base + ":")


def entry_of(f: Found, reg: CatalogRegistry) -> dict[str, Any]:
    return {"name": f.name, "registry": reg.type, "reference": f.reference, "sizeBytes": f.size_bytes,
            "format": f.format}


@dataclass
class Outcome:
    """What one registry gave this sync."""

    registry: CatalogRegistry
    found: list[Found] = field(default_factory=list)
    truncated: bool = False
    error: RegistryError | None = None


def plan_status(mc: ModelCatalog, outcomes: Sequence[Outcome], old_status: Mapping[str, Any], generation: int,
                now: datetime, *, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_STATUS_BYTES) -> dict[str, Any]:
    """The status of a sync (without ``lastSyncTime``: the caller adds it when something changed)."""
    old_entries = [e for e in old_status.get("entries") or () if isinstance(e, Mapping)]
    conds = ConditionSet(old_status.get("conditions"), generation, now)
    n = len(mc.spec.registries)
    conds.items = tuple(c for c in conds.items if _index(c.type) < n)  # registries removed from the spec
    entries: list[dict[str, Any]] = []
    seen: set[str] = set()
    total, truncated, failed = 0, False, []
    for i, out in enumerate(outcomes):
        reg = out.registry
        if out.error is not None:
            mine = [dict(e) for e in old_entries if belongs(e, reg)]
            failed.append(f"registries[{i}] ({describe_registry(reg)}): {out.error.reason}: {out.error.message}")
            conds.set(registry_condition(i), "False", out.error.reason,
                      f"{describe_registry(reg)}: {out.error.message}" + (f" (keeping {len(mine)} entries of the "
                                                                           "last good sync)" if mine else ""))
        else:
            mine = [entry_of(f, reg) for f in sorted(out.found, key=lambda f: (f.name, f.reference))
                    if matches(f, mc.spec.filter_tags, mc.spec.name_pattern)]
            conds.set(registry_condition(i), "True", "Synced", f"{describe_registry(reg)}: {len(mine)} models"
                      + (" (listing cut off at its bound)" if out.truncated else ""))
            truncated = truncated or out.truncated
        for e in mine:
            ref = str(e.get("reference"))
            if ref in seen:
                continue
            seen.add(ref)
            total += 1
            entries.append({k: v for k, v in e.items() if v is not None})
    kept: list[dict[str, Any]] = []
    size = 0
    for e in entries:
        size += len(json.dumps(e))
        if len(kept) >= max_entries or size > max_bytes:
            truncated = True
            break
        kept.append(e)
    status: ConditionStatus = "True" if not failed else "False"
    if not failed:
        reason, msg = "Synced", f"{total} models from {n} registries"
    else:
        reason = "SyncFailed" if len(failed) == n else "RegistryFailed"
        msg = f"{len(failed)} of {n} registries failed: " + "; ".join(failed)
    conds.set(READY, status, reason, msg[:4000])
    return {"observedGeneration": generation, "conditions": conds.to_list(), "entries": kept,
            "totalModels": total, "truncated": truncated}


def _index(cond_type: str) -> int:
    """``Registry3Synced`` -> 3; -1 for other condition types."""
    if not (cond_type.startswith("Registry") and cond_type.endswith("Synced")):
        return -1
    digits = cond_type.removeprefix("Registry").removesuffix("Synced")
    return int(digits) if digits.isdigit() else -1


# ---- credentials ----------------------------------------------------------------------------------


def _secret_value(data: Mapping[str, Any], key: str) -> str | None:
    raw = data.get(key)
    if not isinstance(raw, str):
        return None
    try:
        return base64.b64decode(raw, validate=True).decode().strip()
    except (binascii.Error, UnicodeDecodeError):
        raise RegistryError("InvalidCredentials", f"key {key} of the Secret is not base64 text") from None


def credentials(reg: CatalogRegistry, secret: Mapping[str, Any] | None) -> Credentials:
    """What ``secret`` gives ``reg``: OCI: ``.dockerconfigjson`` (the entry of the registry host:
    username/password, ``auth``, ``identitytoken`` or ``registrytoken``), ``username``/``password``,
    ``ECR_AUTHORIZATION_TOKEN`` (ECR's ``GetAuthorizationToken`` ``authorizationToken``: basic
    ``AWS:<password>``) or ``token``; Hugging Face: ``HF_TOKEN``; Ollama: ``OLLAMA_API_KEY``."""
    if not secret:
        return Credentials()
    data = secret.get("data") or {}
    if reg.type == "HuggingFace":
        return Credentials(token=_secret_value(data, "HF_TOKEN") or _secret_value(data, "token"))
    if reg.type == "Ollama":
        return Credentials(token=_secret_value(data, "OLLAMA_API_KEY") or _secret_value(data, "token"))
    ecr = _secret_value(data, "ECR_AUTHORIZATION_TOKEN")
    if ecr:
        return Credentials.from_auth(ecr)
    cfg = _secret_value(data, ".dockerconfigjson")
    if cfg:
        try:
            auths = json.loads(cfg).get("auths") or {}
        except (ValueError, AttributeError):
            raise RegistryError("InvalidCredentials", ".dockerconfigjson is not a docker config") from None
        host = split_url(reg.url or "")[1]
        for k, v in auths.items():
            if isinstance(v, dict) and str(k).removeprefix("https://").removeprefix("http://").split("/")[0] == host:
                if v.get("registrytoken"):
                    return Credentials(token=str(v["registrytoken"]))
                if v.get("username") is not None and v.get("password") is not None:
                    return Credentials(username=str(v["username"]), password=str(v["password"]))
                if v.get("identitytoken"):
                    return Credentials(username="<token>", password=str(v["identitytoken"]))
                if v.get("auth"):
                    return Credentials.from_auth(str(v["auth"]))
        return Credentials()
    user, pw = _secret_value(data, "username"), _secret_value(data, "password")
    if user is not None and pw is not None:
        return Credentials(username=user, password=pw)
    return Credentials(token=_secret_value(data, "token"))


# ---- the shell ------------------------------------------------------------------------------------


@dataclass
class Syncer:
    """Per operator run: when each catalog last synced (uid, generation, time) and the bounds."""

    max_entries: int = MAX_ENTRIES
    max_bytes: int = MAX_STATUS_BYTES
    request_timeout_s: float = 30.0
    registry_timeout_s: float = 300.0
    per_registry_limit: int = 2000  # manifests / models read per registry and sync
    synced: dict[Key, tuple[str, int, datetime]] = field(default_factory=dict)
    syncs: int = 0  # completed syncs (tests, metrics)

    async def list_registry(self, op: Operator, ns: str, mc: ModelCatalog, reg: CatalogRegistry,
                            session: aiohttp.ClientSession) -> Outcome:
        try:
            secret = None
            if reg.secret_name:
                try:
                    secret = await op.w.kube.get(SECRET, ns, reg.secret_name)
                except KubeAPIError as e:
                    raise RegistryError("SecretUnreadable", f"Secret {ns}/{reg.secret_name}: {e.detail}") from e
                if secret is None:
                    raise RegistryError("SecretNotFound", f"Secret {ns}/{reg.secret_name} does not exist")
            http = RegistryHTTP(session, credentials(reg, secret), what=describe_registry(reg))
            want = name_filter(mc.spec.name_pattern)
            lim = self.per_registry_limit
            if reg.type == "OCI":
                coro = list_oci(http, reg.url or "", want=want, limit=lim)
            elif reg.type == "HuggingFace":
                coro = list_hf(http, reg.url, want=want, tags=mc.spec.filter_tags, pattern=mc.spec.name_pattern,
                               limit=lim)
            else:
                coro = list_ollama(http, reg.url, want=want, limit=lim)
            try:
                found, truncated = await asyncio.wait_for(coro, self.registry_timeout_s)
            except TimeoutError:
                raise RegistryError("Timeout", f"listing took longer than {self.registry_timeout_s:g}s") from None
            return Outcome(reg, found, truncated)
        except RegistryError as e:
            log.warning("catalog %s/%s: %s: %s", ns, mc.meta.name, describe_registry(reg), e)
            return Outcome(reg, error=e)

    async def sync(self, op: Operator, ns: str, mc: ModelCatalog) -> list[Outcome]:
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            return list(await asyncio.gather(*(self.list_registry(op, ns, mc, r, session)
                                               for r in mc.spec.registries)))


async def reconcile_catalog(op: Operator, syncer: Syncer, key: Key) -> Result:
    ns, name = key
    body = op.store.get(MODEL_CATALOG, ns, name)
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        syncer.synced.pop(key, None)
        return Result()
    md = body.get("metadata") or {}
    uid, gen = str(md.get("uid") or ""), int(md.get("generation") or 0)
    now = op.clock()
    old = body.get("status") or {}
    try:
        mc = ModelCatalog.from_obj(body)
    except SpecError as e:
        conds = ConditionSet(old.get("conditions"), gen, now)
        conds.set(READY, "False", e.reason, e.message)
        await op.w.patch_status(MODEL_CATALOG, body, {"observedGeneration": gen, "conditions": conds.to_list()})
        return Result(permanent=f"{e.reason}: {e.message}")
    last = syncer.synced.get(key)
    interval = max(1.0, mc.spec.sync_interval_s)
    if last is not None and last[:2] == (uid, gen):
        due = last[2] + timedelta(seconds=interval)
        if now < due:
            return Result(requeue_after=(due - now).total_seconds())
    outcomes = await syncer.sync(op, ns, mc)
    desired = plan_status(mc, outcomes, old, gen, now, max_entries=syncer.max_entries, max_bytes=syncer.max_bytes)
    if merge_patch({"status": desired}, {"status": old}) or not old.get("lastSyncTime"):
        desired["lastSyncTime"] = format_time(now)
    after = await op.w.patch_status(MODEL_CATALOG, body, desired)
    syncer.synced[key] = (uid, gen, now)
    syncer.syncs += 1
    old_ready = next((c.get("reason") for c in old.get("conditions") or () if c.get("type") == READY), None)
    new_ready = next(c for c in desired["conditions"] if c["type"] == READY)
    if after is not None and old_ready != new_ready["reason"]:
        op.record(after, Event("Normal" if new_ready["status"] == "True" else "Warning", new_ready["reason"],
                               new_ready["message"][:1000]))
    return Result(requeue_after=interval)
