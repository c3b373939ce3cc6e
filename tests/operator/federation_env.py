"""Member clusters for the federation tests: more Kubernetes API emulators beside the hub's ``kube``.

A :class:`Member` is one emulator (its own objects, CRDs registered) served on a fixed port, so it can
be stopped (the server closes: connections are refused, as for a cluster that went away) and started
again on the same port with its objects intact (the kubeconfig in the hub's Secret stays valid).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock
import yaml

from tests.api.helpers import CRDS
from tests.kube_emulator import FlexEmulator, KubeEnv, write_kubeconfig

CLUSTERS = "ai.flexinfer/v1alpha2/clusters"
FEDERATED = "ai.flexinfer/v1alpha2/federatedmodels"
SECRETS = "v1/secrets"


@functools.cache
def _model_crd() -> dict[str, Any]:
    """The Model CRD (the only kind a member needs here), parsed once per test process."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    doc: dict[str, Any] = yaml.load((CRDS / "ai.flexinfer_models.yaml").read_text(), Loader=loader)
    return doc


class Member:
    """One member cluster: an emulator that can be stopped and restarted on the same port."""

    def __init__(self, name: str, directory: Path) -> None:
        self.name = name
        self.emulator = FlexEmulator()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            self.emulator.resources.load_bundled()
        self.kubeconfig_path = directory / f"{name}.kubeconfig"
        self.port: int | None = None
        self._server: kmock.Server | None = None
        self.env: KubeEnv | None = None

    async def start(self) -> None:
        server = kmock.Server(self.emulator, host="127.0.0.1", port=self.port)
        await server.__aenter__()
        self._server = server
        self.port = server.url.port
        self.env = KubeEnv(emulator=self.emulator, server=server, kubeconfig_path=self.kubeconfig_path)
        if not self.kubeconfig_path.exists():
            write_kubeconfig(self.kubeconfig_path, self.env.url)
            self.env.register_crd(_model_crd())

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.__aexit__(None, None, None)
            self._server = None

    @property
    def kube(self) -> KubeEnv:
        assert self.env is not None
        return self.env

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, token: str = "dummy") -> str:
        return self.kubeconfig_path.read_text() if token == "dummy" else json.dumps(
            {**json.loads(self.kubeconfig_path.read_text()),
             "users": [{"name": "emulator", "user": {"token": token}}]})

    def model(self, name: str, ns: str = "default") -> dict[str, Any] | None:
        return self.kube.get("ai.flexinfer/v1alpha2/models", ns, name)

    def model_writes(self) -> int:
        return self.kube.write_count("models.ai.flexinfer")


@contextlib.asynccontextmanager
async def members(directory: Path, *names: str) -> AsyncIterator[dict[str, Member]]:
    out = {n: Member(n, directory) for n in names}
    async with contextlib.AsyncExitStack() as stack:
        for m in out.values():
            await stack.enter_async_context(m.emulator)
            await m.start()
            stack.push_async_callback(m.stop)
        yield out


def kubeconfig_secret(name: str, text: str, key: str = "kubeconfig", ns: str = "default") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": ns},
            "type": "Opaque", "data": {key: base64.b64encode(text.encode()).decode()}}


def cluster(name: str, secret: str, ns: str = "default", interval: str = "200ms",
            **labels: str) -> dict[str, Any]:
    return {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Cluster", "metadata": {"name": name, "namespace": ns},
            "spec": {"apiEndpoint": f"https://{name}.example.com:6443", "secretRef": {"name": secret, "key": "kubeconfig"},
                     "labels": labels, "probeInterval": interval}}


def federated(name: str, *, clusters: list[str] | None = None, selector: dict[str, Any] | None = None,
              ns: str = "default", **placement: Any) -> dict[str, Any]:
    p: dict[str, Any] = dict(placement)
    if clusters is not None:
        p["clusters"] = clusters
    if selector is not None:
        p["clusterSelector"] = selector
    return {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "FederatedModel",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"template": {"backend": "ollama", "source": "ollama://llama3:8b"}, "placement": p}}
