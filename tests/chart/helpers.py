"""Rendering the chart with the real Helm engine (helm_python) and reading the result."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml
from helm_python import _native

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "flexinfer"
RELEASE, NAMESPACE = "flexinfer", "flexinfer-system"
#: Kubernetes versions every manifest is validated against (kubernetes-validate bundles 1.25-1.37)
KUBE_VERSIONS = ("1.30.0", "1.33.0")
MONITORING = ("monitoring.coreos.com/v1",)
WORKLOAD_KINDS = ("Deployment", "DaemonSet", "StatefulSet", "Job")


def render_raw(values: Mapping[str, Any] | None = None, *, name: str = RELEASE, namespace: str = NAMESPACE,
               api_versions: Sequence[str] = (), kube_version: str = "v1.33.0") -> dict[str, str]:
    """``template path -> text``. helm_python's ``Chart.render`` has no capabilities options, but its
    native call takes ``api_versions`` and ``kube_version`` (Helm's ``--api-versions``/``--kube-version``)."""
    opts = {"name": name, "namespace": namespace, "is_install": True, "kube_version": kube_version,
            "api_versions": list(api_versions)}
    with helm.Chart.load(CHART) as ch:
        out: dict[str, str] = json.loads(_native.call_string(
            "helm_render", ch._raw(), json.dumps(dict(values or {})), json.dumps(opts)))
    return out


def render(values: Mapping[str, Any] | None = None, **kw: Any) -> list[dict[str, Any]]:
    """Every object the chart renders (NOTES.txt left out)."""
    objs: list[dict[str, Any]] = []
    for path, text in sorted(render_raw(values, **kw).items()):
        if path.endswith("NOTES.txt"):
            continue
        objs += [d for d in yaml.safe_load_all(text) if d]
    return objs


def notes(values: Mapping[str, Any] | None = None, **kw: Any) -> str:
    return next(t for p, t in render_raw(values, **kw).items() if p.endswith("NOTES.txt"))


def of_kind(objs: Sequence[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: Sequence[Mapping[str, Any]], kind: str, component: str) -> Mapping[str, Any]:
    (o,) = [o for o in of_kind(objs, kind) if o["metadata"]["labels"]["app.kubernetes.io/component"] == component]
    return o


def pod_spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj["spec"]["template"]["spec"]


def containers(obj: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    spec = pod_spec(obj)
    yield from spec.get("initContainers") or []
    yield from spec["containers"]


def env_of(container: Mapping[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


def container(obj: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    (c,) = [c for c in containers(obj) if c["name"] == name]
    return c
