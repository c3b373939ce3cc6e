"""Keys of measured tokens/s: the one contract between the bench runner and the scheduler extender.

The bench runner (``flexinfer.tps``) writes and the extender (``flexinfer.scheduler``) reads the
global ConfigMap (``BENCHMARK_RESULTS_CONFIGMAP``, default ``flexinfer-benchmark-results``) with
``data["bench_<hash>"] = "<tokens/s>"`` and ``data["meta_<hash>"] = "<JSON>"``, where
``hash = sha256(f"{backend}|{model}|{device_class}").hexdigest()[:16]`` and the device class is
``vendor=…,arch=…,vram=…,count=…,int4=…`` built from the node agent's ``gpu.*`` labels, as the
original system did (``shared/reference/flexinfer-upstream.md`` §5 and §7.1).

Both sides must pass the same canonical backend name (the backend registry's, e.g. ``llamacpp``)
and the same model name. The spellings (ConfigMap names, key prefixes, node label keys) come from
:mod:`flexinfer.labels`. This module is pure: no I/O, no Kubernetes client.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from flexinfer import labels

GLOBAL_CONFIGMAP_ENV = "BENCHMARK_RESULTS_CONFIGMAP"
GLOBAL_CONFIGMAP_DEFAULT = labels.BENCHMARK_CONFIGMAP
BENCH_PREFIX = labels.BENCH_KEY_PREFIX
META_PREFIX = labels.BENCH_META_PREFIX
DEFAULT_LABEL_PREFIX = labels.PREFIX


def device_class(vendor: str = "", arch: str = "", vram: str = "", count: str | int = "",
                 int4: str | bool = "") -> str:
    """``vendor=NVIDIA,arch=sm_86,vram=24Gi,count=1,int4=true`` (booleans as true/false)."""
    if isinstance(int4, bool):
        int4 = "true" if int4 else "false"
    return f"vendor={vendor},arch={arch},vram={vram},count={count},int4={int4}"


def device_class_from_labels(node_labels: Mapping[str, str], prefix: str = DEFAULT_LABEL_PREFIX) -> str:
    """The device class of a node from its labels (``<prefix>gpu.vendor`` …); missing ones are empty."""
    keys = labels.node_keys(prefix)
    return device_class(vendor=node_labels.get(keys.gpu_vendor, ""), arch=node_labels.get(keys.gpu_arch, ""),
                        vram=node_labels.get(keys.gpu_vram, ""), count=node_labels.get(keys.gpu_count, ""),
                        int4=node_labels.get(keys.gpu_int4, ""))


def bench_hash(backend: str, model: str, device_class: str) -> str:
    """16 hex chars identifying (backend, model, device class)."""
    return hashlib.sha256(f"{backend}|{model}|{device_class}".encode()).hexdigest()[:16]


def bench_key(backend: str, model: str, device_class: str) -> str:
    """Global ConfigMap key holding the tokens/s, as a decimal string."""
    return BENCH_PREFIX + bench_hash(backend, model, device_class)


def meta_key(backend: str, model: str, device_class: str) -> str:
    """Global ConfigMap key holding the JSON metadata of that measurement."""
    return META_PREFIX + bench_hash(backend, model, device_class)


def deployment_configmap_name(deployment: str) -> str:
    """The per-deployment results ConfigMap the original operator waits for."""
    return deployment + labels.BENCHMARK_CONFIGMAP_SUFFIX
