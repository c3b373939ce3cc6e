"""The resource kinds the operator reads and writes: group, version, plural, kind, scope and URL paths.

Pure data (no client): the pure rules and the read model name kinds through these constants; the API
client (``kubeapi``) builds its URLs from them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote

from flexinfer import labels


@dataclass(frozen=True, slots=True)
class Kind:
    """One resource type: where it lives in the API."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    #: ``deployments.apps``, ``models.ai.flexinfer``, ``services``: a short unique name
    key: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", f"{self.plural}.{self.group}" if self.group else self.plural)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name, safe='')}"
            if sub:
                base += f"/{sub}"
        return base


G = labels.API_GROUP
DEPLOYMENT = Kind("apps", "v1", "deployments", "Deployment")
SERVICE = Kind("", "v1", "services", "Service")
PVC = Kind("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")
JOB = Kind("batch", "v1", "jobs", "Job")
CONFIGMAP = Kind("", "v1", "configmaps", "ConfigMap")
ENDPOINTS = Kind("", "v1", "endpoints", "Endpoints")
NODE = Kind("", "v1", "nodes", "Node", namespaced=False)
EVENT = Kind("", "v1", "events", "Event")
MODEL = Kind(G, "v1alpha2", "models", "Model")
LORA = Kind(G, "v1alpha2", "loraadapters", "LoRAAdapter")
MODEL_DEPLOYMENT = Kind(G, "v1alpha1", "modeldeployments", "ModelDeployment")
MODEL_CACHE = Kind(G, "v1alpha1", "modelcaches", "ModelCache")
GPU_GROUP = Kind(G, "v1alpha1", "gpugroups", "GPUGroup")
CLUSTER = Kind(G, "v1alpha2", "clusters", "Cluster")
FEDERATED_MODEL = Kind(G, "v1alpha2", "federatedmodels", "FederatedModel")
SECRET = Kind("", "v1", "secrets", "Secret")  # read (kubeconfigs of Clusters), never watched

#: children the operator creates (watched with a managed-by label filter)
CHILD_KINDS = (DEPLOYMENT, SERVICE, PVC, JOB, CONFIGMAP, ENDPOINTS)
#: FlexInfer kinds the operator reconciles
OWN_KINDS = (MODEL, LORA, MODEL_DEPLOYMENT, MODEL_CACHE, GPU_GROUP)
KIND_BY_NAME: Mapping[str, Kind] = {k.kind: k for k in (*CHILD_KINDS, NODE, EVENT, *OWN_KINDS)}
