"""API clients of the member clusters, one per ``Cluster``, opened from the kubeconfig in its Secret.

Owns: reading the Secret named by a Cluster's ``spec.secretRef`` (from the Cluster's namespace, on
the hub, with a plain GET each time a client is asked for afresh: Secrets are never watched),
checking the kubeconfig (:mod:`flexinfer.k8s.kubeconfig`), and keeping one :class:`KubeClient` per
Cluster, reused while the kubeconfig's fingerprint is the same and closed when it changes or the
Cluster goes. Member requests are not retried here (``retries=0``): a probe that fails is an answer,
and the callers decide how soon to ask again. Also the per-Cluster probe memory the Cluster
controller keeps between probes (:class:`ProbeMemory`: failures in a row, recent latencies, the
last generation seen).

Must not: decide phases or write anything (``cluster`` and ``federation`` do).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from flexinfer.k8s.errors import KubeAPIError
from flexinfer.k8s.kubeconfig import (
    KubeconfigError,
    fingerprint,
    open_client,
    parse_kubeconfig,
    secret_value,
    server_of,
)
from flexinfer.operator.api_resources import SECRET
from flexinfer.operator.kubeapi import KubeClient

Key = tuple[str, str]  # (namespace, Cluster name)
SECRET_NOT_FOUND = "SecretNotFound"
SECRET_FORBIDDEN = "SecretForbidden"
KUBECONFIG_INVALID = "KubeconfigInvalid"


class MemberConfigError(Exception):
    """The Cluster's credentials cannot be used: ``reason`` (CamelCase) and a message for its condition."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class Member:
    """An open client to one member cluster."""

    fingerprint: str
    server: str
    kube: KubeClient
    warm: bool = False  # a request went through this client (its connection is open): probes time from then


@dataclass
class ProbeMemory:
    """What the Cluster controller remembers between probes of one Cluster (in memory only)."""

    failures: int = 0
    latencies_ms: deque[float] = field(default_factory=lambda: deque(maxlen=5))
    generation: Any = None


class MemberClients:
    """One client per Cluster (see the module docstring)."""

    def __init__(self, timeout_s: float = 10.0) -> None:
        self.timeout_s = timeout_s
        self._members: dict[Key, Member] = {}
        self._locks: dict[Key, asyncio.Lock] = {}
        self.probes: dict[Key, ProbeMemory] = {}

    def memory(self, key: Key) -> ProbeMemory:
        mem = self.probes.get(key)
        if mem is None:
            mem = self.probes[key] = ProbeMemory()
        return mem

    def cached(self, key: Key) -> Member | None:
        return self._members.get(key)

    async def open(self, hub: KubeClient, namespace: str, name: str, secret_name: str,
                   secret_key: str | None) -> Member:
        """The client of Cluster ``namespace/name``, (re)opened when its kubeconfig changed.

        Raises :class:`MemberConfigError` for a missing or unusable Secret or kubeconfig, and
        ``KubeAPIError`` when the hub itself fails to answer."""
        key = (namespace, name)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:  # the Cluster probe and a FederatedModel may ask at once: one client
            return await self._open(hub, key, secret_name, secret_key)

    async def _open(self, hub: KubeClient, key: Key, secret_name: str, secret_key: str | None) -> Member:
        namespace = key[0]
        try:
            secret = await hub.get(SECRET, namespace, secret_name)
        except KubeAPIError as e:
            if e.status == 403:
                raise MemberConfigError(SECRET_FORBIDDEN, f"Secret {namespace}/{secret_name} may not be read "
                                                          f"by the operator: {e.detail}") from None
            raise
        if secret is None:
            await self.drop(key)
            raise MemberConfigError(SECRET_NOT_FOUND, f"Secret {namespace}/{secret_name} not found")
        try:
            text = secret_value(secret, secret_key)
            fp = fingerprint(text)
            have = self._members.get(key)
            if have is not None and have.fingerprint == fp:
                return have
            cfg = parse_kubeconfig(text)
            server = server_of(cfg)
            api = await open_client(cfg)
        except KubeconfigError as e:
            await self.drop(key)
            raise MemberConfigError(KUBECONFIG_INVALID, f"Secret {namespace}/{secret_name}: {e}") from None
        await self.drop(key)
        member = self._members[key] = Member(fp, server, KubeClient(api, timeout_s=self.timeout_s, retries=0))
        return member

    async def drop(self, key: Key) -> None:
        """Close and forget the client of one Cluster (its probe memory stays unless ``forget``)."""
        member = self._members.pop(key, None)
        if member is not None:
            with contextlib.suppress(Exception):
                await member.kube.close()

    async def forget(self, key: Key) -> None:
        await self.drop(key)
        self.probes.pop(key, None)
        self._locks.pop(key, None)

    async def close(self) -> None:
        for key in list(self._members):
            await self.drop(key)

    def keys(self) -> list[Key]:
        return list(self._members)

