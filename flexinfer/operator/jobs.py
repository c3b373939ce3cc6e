"""Pure builders for the operator's Jobs: cache prefetch/copy/check, tmpfs cleanup, benchmark.

Owns (``shared/reference/flexinfer-upstream.md`` §2.2–2.3, §2.6):

- ``<n>-cache-prefetch``: Hugging Face ``snapshot_download`` (the FlexInfer image, which holds
  ``huggingface_hub``: nothing is installed at run time; non-root, ``fsGroup`` makes the cache PVC
  writable) or ``git lfs clone`` for MLC repositories, into ``/models/<n>`` on the cache PVC, marker ``.flexinfer_cached``; allow/ignore
  patterns, revision and an optional VAE repository from ``spec.config``; backoff 3;
- ``<n>-cache-copy``: ``cp -a`` of a ``pvc://`` source into the cache PVC, marker
  ``.flexinfer_cached_<sha256(source)>``, backoff 1; ``<n>-cache-check``: fails when the path in the
  source PVC is missing or empty, backoff 0;
- ``<n>-tmpfs-cleanup``: removes a shared Model's ``/dev/shm/flexinfer/<ns>/<n>``; TTL 120 s, no owner;
- ``<md>-benchmark``: ``flexinfer bench`` into ``<md>-benchmark-results``; ModelCache prefetch Jobs.

Every cache Job carries the annotations ``flexinfer.ai/source``, ``cache-kind``, ``cache-pvc`` and
``cache-dest`` (a Job whose recorded source differs from the spec is recreated), the Model's
nodeSelector, the GPU toleration, no service-account token and an owner reference. Job pods never
carry the Deployment's selector labels (the Service must not route to them).
Must not: do I/O.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from flexinfer import labels
from flexinfer.api.model_view import Model
from flexinfer.backends import ConfigKind, read_config
from flexinfer.operator.builders import (
    FLASH_SHM_ROOT,
    GPU_TOLERATION,
    MODELS_DIR,
    cache_pvc_name,
    child_name,
    meta,
    object_labels,
)
from flexinfer.operator.config import OperatorSettings

MARKER = ".flexinfer_cached"
PREFETCH, COPY, CHECK = "prefetch", "copy", "check"
#: the FlexInfer image's user (Containerfile); fsGroup lets it write the cache PVC
IMAGE_UID = 65532
HF_SECURITY_CONTEXT: Mapping[str, Any] = {"runAsUser": IMAGE_UID, "runAsGroup": IMAGE_UID, "runAsNonRoot": True,
                                          "fsGroup": IMAGE_UID, "fsGroupChangePolicy": "OnRootMismatch"}

_HF_SCRIPT = """set -e
if [ -f "$DEST/.flexinfer_cached" ]; then echo "already cached in $DEST"; exit 0; fi
python - <<'PY'
import json, os
from huggingface_hub import snapshot_download
def patterns(name):
    raw = os.environ.get(name)
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return [value] if isinstance(value, str) else list(value)
token = os.environ.get("HF_TOKEN") or None
snapshot_download(repo_id=os.environ["HF_REPO"], local_dir=os.environ["DEST"],
                  revision=os.environ.get("HF_REVISION") or None, token=token,
                  allow_patterns=patterns("HF_ALLOW_PATTERNS"), ignore_patterns=patterns("HF_IGNORE_PATTERNS"))
if os.environ.get("VAE_REPO"):
    snapshot_download(repo_id=os.environ["VAE_REPO"], local_dir=os.environ["VAE_DEST_DIR"], token=token)
PY
touch "$DEST/.flexinfer_cached"
"""

_GIT_SCRIPT = """set -e
if [ -f "$DEST/.flexinfer_cached" ]; then echo "already cached in $DEST"; exit 0; fi
apt-get update -qq && apt-get install -y -qq git git-lfs ca-certificates >/dev/null
git lfs install --skip-repo
rm -rf "$DEST" && mkdir -p "$(dirname "$DEST")"
URL="https://huggingface.co/$HF_REPO"
if [ -n "$HF_TOKEN" ]; then URL="https://user:$HF_TOKEN@huggingface.co/$HF_REPO"; fi
git clone --depth 1 ${HF_REVISION:+--branch "$HF_REVISION"} "$URL" "$DEST"
rm -rf "$DEST/.git"
touch "$DEST/.flexinfer_cached"
"""

_ORAS_SCRIPT = """set -e
if [ -f "$DEST/.flexinfer_cached" ]; then echo "already cached in $DEST"; exit 0; fi
mkdir -p "$DEST"
oras pull "$OCI_REF" -o "$DEST"
touch "$DEST/.flexinfer_cached"
"""


def _env(env: Mapping[str, str | None]) -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in sorted(env.items()) if v is not None]


def _secret_env(name: str, secret: str, key: str = "HF_TOKEN") -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}}}


def job(name: str, namespace: str, *, obj_labels: Mapping[str, str], pod_labels: Mapping[str, str],
        owner: Mapping[str, Any] | None, annotations: Mapping[str, str], container: Mapping[str, Any],
        volumes: Sequence[Mapping[str, Any]], backoff: int, node_selector: Mapping[str, str] | None = None,
        ttl: int | None = None, service_account: str | None = None,
        pull_secrets: Sequence[str] = (), security_context: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A batch/v1 Job that runs ``container`` once (restartPolicy Never)."""
    pod: dict[str, Any] = {"restartPolicy": "Never", "automountServiceAccountToken": service_account is not None,
                           "tolerations": [dict(GPU_TOLERATION)], "containers": [dict(container)]}
    if security_context:
        pod["securityContext"] = dict(security_context)
    if volumes:
        pod["volumes"] = [dict(v) for v in volumes]
    if node_selector:
        pod["nodeSelector"] = dict(node_selector)
    if service_account:
        pod["serviceAccountName"] = service_account
    if pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in pull_secrets]
    spec: dict[str, Any] = {"backoffLimit": backoff,
                            "template": {"metadata": {"labels": dict(pod_labels)}, "spec": pod}}
    if ttl is not None:
        spec["ttlSecondsAfterFinished"] = ttl
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": meta(name, namespace, obj_labels, owner, annotations), "spec": spec}


def _cache_labels(m: Model, kind: str) -> tuple[dict[str, str], dict[str, str]]:
    obj = {**object_labels(m), labels.APP_COMPONENT: f"cache-{kind}"}
    pod = {labels.MANAGED_BY: labels.MANAGED_BY_VALUE, labels.MODEL: m.name, labels.APP_COMPONENT: f"cache-{kind}"}
    return obj, pod


def cache_job_name(m: Model, kind: str) -> str:
    return child_name(m.name, f"cache-{kind}")


def is_mlc_source(model_id: str) -> bool:
    return model_id.startswith("mlc-ai/") or "-MLC" in model_id


def _hf_patterns(m: Model) -> tuple[str | None, str | None]:
    c = m.spec.config
    allow = read_config(c, "hfAllowPatterns", ConfigKind.JSON)
    ignore = read_config(c, "hfIgnorePatterns", ConfigKind.JSON)
    if m.spec.backend == "llamacpp":
        extra = [f for f in (m.spec.gguf_file, read_config(c, "mmproj", ConfigKind.STR)) if f]
        pats: list[str] = []
        if allow:
            try:
                parsed = json.loads(allow)
            except ValueError:
                parsed = allow
            pats = [parsed] if isinstance(parsed, str) else [str(p) for p in parsed]
        allow = json.dumps(sorted(set(pats + extra)), separators=(",", ":"))
    return allow, ignore


def prefetch_job(m: Model, owner: Mapping[str, Any], settings: OperatorSettings) -> dict[str, Any]:
    """``<n>-cache-prefetch``: the HF repository into ``/models/<n>`` on the cache PVC."""
    repo = m.spec.source.model_id
    dest = f"{MODELS_DIR}/{m.name}"
    allow, ignore = _hf_patterns(m)
    c = m.spec.config
    vae = read_config(c, "vaeRepo", ConfigKind.STR)
    env: list[dict[str, Any]] = _env({
        "HF_REPO": repo, "DEST": dest, "HF_ALLOW_PATTERNS": allow, "HF_IGNORE_PATTERNS": ignore,
        "HF_REVISION": read_config(c, "hfRevision", ConfigKind.STR), "VAE_REPO": vae,
        "VAE_DEST_DIR": f"{dest}/vae" if vae else None, "HF_HOME": f"{MODELS_DIR}/.cache/huggingface"})
    if settings.hf_token_secret:
        env.append(_secret_env("HF_TOKEN", settings.hf_token_secret))
    git = is_mlc_source(repo)
    container = {"name": PREFETCH, "image": settings.git_image if git else settings.prefetch_image,
                 "imagePullPolicy": settings.image_pull_policy, "command": ["/bin/sh", "-c", _GIT_SCRIPT if git else _HF_SCRIPT],
                 "env": env, "volumeMounts": [{"name": "cache", "mountPath": MODELS_DIR}],
                 "resources": {"requests": {"cpu": "100m", "memory": "1Gi"}, "limits": {"memory": "8Gi"}}}
    obj, pod = _cache_labels(m, PREFETCH)
    pvc = cache_pvc_name(m)
    return job(cache_job_name(m, PREFETCH), m.namespace, obj_labels=obj, pod_labels=pod, owner=owner,
               annotations=cache_annotations(m, PREFETCH, pvc, dest), container=container,
               volumes=[{"name": "cache", "persistentVolumeClaim": {"claimName": pvc}}], backoff=3,
               node_selector=m.spec.node_selector, pull_secrets=settings.pull_secrets,
               security_context=None if git else HF_SECURITY_CONTEXT)


def cache_annotations(m: Model, kind: str, pvc: str, dest: str) -> dict[str, str]:
    return {labels.SOURCE: m.spec.source.raw, labels.CACHE_KIND: kind, labels.CACHE_PVC: pvc,
            labels.CACHE_DEST: dest}


def copy_job(m: Model, owner: Mapping[str, Any], settings: OperatorSettings) -> dict[str, Any]:
    """``<n>-cache-copy``: a ``pvc://`` source copied into the cache PVC at ``/models/<n>``."""
    src = m.spec.source
    sub = src.pvc_path
    digest = hashlib.sha256(src.raw.encode()).hexdigest()
    dest = f"{MODELS_DIR}/{m.name}"
    marker = f"{dest}/{MARKER}_{digest}"
    from_dir = f"/src/{sub}" if sub else "/src"
    script = (f"set -e\nif [ -f {shlex.quote(marker)} ]; then echo already copied; exit 0; fi\n"
              f"mkdir -p {shlex.quote(dest)}\ncp -a {shlex.quote(from_dir)}/. {shlex.quote(dest)}/\n"
              f"touch {shlex.quote(marker)}\n")
    pvc = cache_pvc_name(m)
    container = {"name": COPY, "image": settings.copy_image, "imagePullPolicy": settings.image_pull_policy,
                 "command": ["/bin/sh", "-c", script],
                 "volumeMounts": [{"name": "source", "mountPath": "/src", "readOnly": True},
                                  {"name": "cache", "mountPath": MODELS_DIR}]}
    obj, pod = _cache_labels(m, COPY)
    return job(cache_job_name(m, COPY), m.namespace, obj_labels=obj, pod_labels=pod, owner=owner,
               annotations=cache_annotations(m, COPY, pvc, dest), container=container,
               volumes=[{"name": "source", "persistentVolumeClaim": {"claimName": src.pvc_claim, "readOnly": True}},
                        {"name": "cache", "persistentVolumeClaim": {"claimName": pvc}}],
               backoff=1, node_selector=m.spec.node_selector, pull_secrets=settings.pull_secrets)


def check_job(m: Model, owner: Mapping[str, Any], settings: OperatorSettings) -> dict[str, Any]:
    """``<n>-cache-check``: fails when the path inside the source PVC is missing or empty."""
    src = m.spec.source
    path = f"{MODELS_DIR}/{src.pvc_path}" if src.pvc_path else MODELS_DIR
    q = shlex.quote(path)
    script = (f'if [ -d {q} ] && [ -n "$(ls -A {q})" ]; then echo found; exit 0; fi\n'
              f"echo 'missing or empty: {path}' >&2; exit 1\n")
    container = {"name": CHECK, "image": settings.check_image, "imagePullPolicy": settings.image_pull_policy,
                 "command": ["/bin/sh", "-c", script],
                 "volumeMounts": [{"name": "source", "mountPath": MODELS_DIR, "readOnly": True}]}
    obj, pod = _cache_labels(m, CHECK)
    claim = src.pvc_claim or ""
    ann = {labels.SOURCE: src.raw, labels.CACHE_KIND: CHECK, labels.CACHE_PVC: claim, labels.CACHE_PATH: path}
    return job(cache_job_name(m, CHECK), m.namespace, obj_labels=obj, pod_labels=pod, owner=owner, annotations=ann,
               container=container,
               volumes=[{"name": "source", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}],
               backoff=0, node_selector=m.spec.node_selector, pull_secrets=settings.pull_secrets)


def tmpfs_cleanup_job(m: Model, settings: OperatorSettings) -> dict[str, Any]:
    """``<n>-tmpfs-cleanup``: removes the shared Model's tmpfs directory; no owner (outlives the Model)."""
    target = f"/shm/{m.namespace}/{m.name}"
    container = {"name": "cleanup", "image": settings.cleanup_image, "imagePullPolicy": settings.image_pull_policy,
                 "command": ["/bin/sh", "-c", f"rm -rf {shlex.quote(target)}"],
                 "volumeMounts": [{"name": "shm", "mountPath": "/shm"}]}
    lbls = {labels.MANAGED_BY: labels.MANAGED_BY_VALUE, labels.MODEL: m.name, labels.APP_COMPONENT: "tmpfs-cleanup"}
    return job(child_name(m.name, "tmpfs-cleanup"), m.namespace, obj_labels=lbls, pod_labels=lbls, owner=None,
               annotations={}, container=container,
               volumes=[{"name": "shm", "hostPath": {"path": FLASH_SHM_ROOT, "type": "DirectoryOrCreate"}}],
               backoff=1, node_selector=m.spec.node_selector, ttl=120, pull_secrets=settings.pull_secrets)


def job_phase(j: Mapping[str, Any] | None) -> str:
    """Pending | Running | Succeeded | Failed ("" when there is no Job)."""
    if j is None:
        return ""
    st = j.get("status") or {}
    for c in st.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("status") == "True":
            if c.get("type") == "Complete":
                return "Succeeded"
            if c.get("type") == "Failed":
                return "Failed"
    if int(st.get("succeeded") or 0) > 0:
        return "Succeeded"
    backoff = int(((j.get("spec") or {}).get("backoffLimit")) or 0)
    if int(st.get("failed") or 0) > backoff:
        return "Failed"
    if int(st.get("active") or 0) > 0:
        return "Running"
    return "Pending"


def recorded_source(j: Mapping[str, Any]) -> str | None:
    return ((j.get("metadata") or {}).get("annotations") or {}).get(labels.SOURCE)


# ---- ModelDeployment and ModelCache Jobs -------------------------------------------------------------------

def benchmark_job(name: str, namespace: str, *, backend: str, obj_labels: Mapping[str, str],
                  owner: Mapping[str, Any], warmup: int, iterations: int, min_duration_s: float, max_tokens: int,
                  node_selector: Mapping[str, str] | None, settings: OperatorSettings) -> dict[str, Any]:
    """``<md>-benchmark``: ``flexinfer bench`` through the proxy into ``<md>-benchmark-results``."""
    args = ["bench", "--base-url", settings.proxy_url.rstrip("/") + "/v1", "--model", name,
            "--configmap", f"{name}{labels.BENCHMARK_CONFIGMAP_SUFFIX}", "--namespace", namespace,
            "--backend", backend, "--warmup", str(warmup), "--iterations", str(iterations),
            "--min-duration", f"{min_duration_s:g}", "--max-tokens", str(max_tokens), "--no-progress"]
    container = {"name": "benchmark", "image": settings.bench_image, "imagePullPolicy": settings.image_pull_policy,
                 "command": ["flexinfer"], "args": args,
                 "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}}
    lbls = {**obj_labels, labels.APP_COMPONENT: "benchmark"}
    pod = {labels.MANAGED_BY: labels.MANAGED_BY_VALUE, labels.APP_COMPONENT: "benchmark"}
    return job(child_name(name, "benchmark"), namespace, obj_labels=lbls, pod_labels=pod, owner=owner,
               annotations={}, container=container, volumes=[], backoff=3, service_account=settings.bench_service_account,
               pull_secrets=settings.pull_secrets)


def modelcache_prefetch_job(name: str, namespace: str, *, source: str, claim: str, dest: str,
                            obj_labels: Mapping[str, str], owner: Mapping[str, Any],
                            node_selector: Mapping[str, str] | None, secret: str | None,
                            settings: OperatorSettings) -> dict[str, Any]:
    """``<mc>-prefetch``: a ModelCache source (HF, MLC, OCI/ORAS) into ``dest`` on ``claim``."""
    scheme, _, ref = source.partition("://")
    env: list[dict[str, Any]] = _env({"DEST": dest, "HF_REPO": ref if scheme != "oci" else None,
                                      "OCI_REF": ref if scheme in ("oci", "oras") else None,
                                      "HF_HOME": f"{MODELS_DIR}/.cache/huggingface"})
    if secret:
        env.append(_secret_env("HF_TOKEN", secret))
    security: Mapping[str, Any] | None = None
    if scheme in ("oci", "oras"):
        image, script = settings.oras_image, _ORAS_SCRIPT
    elif scheme == "mlc" or is_mlc_source(ref):
        image, script = settings.git_image, _GIT_SCRIPT
    else:
        image, script, security = settings.prefetch_image, _HF_SCRIPT, HF_SECURITY_CONTEXT
    container = {"name": PREFETCH, "image": image, "imagePullPolicy": settings.image_pull_policy,
                 "command": ["/bin/sh", "-c", script], "env": env,
                 "volumeMounts": [{"name": "cache", "mountPath": MODELS_DIR}],
                 "resources": {"requests": {"cpu": "100m", "memory": "1Gi"}, "limits": {"memory": "8Gi"}}}
    pod = {labels.MANAGED_BY: labels.MANAGED_BY_VALUE, labels.APP_COMPONENT: "modelcache-prefetch"}
    ann = {labels.SOURCE: source, labels.CACHE_KIND: PREFETCH, labels.CACHE_PVC: claim, labels.CACHE_DEST: dest}
    return job(child_name(name, "prefetch"), namespace, obj_labels=obj_labels, pod_labels=pod, owner=owner,
               annotations=ann, container=container,
               volumes=[{"name": "cache", "persistentVolumeClaim": {"claimName": claim}}], backoff=3,
               node_selector=node_selector, pull_secrets=settings.pull_secrets, security_context=security)
