"""flexinfer.k8s: the Kubernetes API plumbing every cluster component shares.

- ``client``: the one way to open a ``kubernetes_asyncio`` API client (explicit kubeconfig, else
  in-cluster, else ``$KUBECONFIG``/``~/.kube/config``).
- ``reflector``: the one resumable list+watch loop (``ResourceWatch``), used by the proxy's ``kube``
  runtime and the scheduler extender's inventory.
- ``backoff``: the one exponential backoff (``Backoff``); each caller keeps its own delays and caps.
- ``kubeconfig``: kubeconfigs handed over as data (a Secret's value): checked, then opened as a client
  (no ``exec`` users, no local file paths).
- ``errors``: the one API error type (``KubeAPIError``: status, reason, message, Retry-After).

Must not: know FlexInfer's kinds or what objects mean (that is ``flexinfer.api`` and the callers), or
import anything from the proxy, the operator, the scheduler or the agent. Nothing is imported here,
so importing one module does not pull in the others.
"""
