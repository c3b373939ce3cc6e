"""``flexinfer operator``: run the kopf operator (cluster-wide or in some namespaces).

Owns: the command-line flags (each overrides its environment variable of ``OperatorSettings``), the
choice between standalone and peering (leader election through kopf's peering objects), the liveness
endpoint, and starting kopf with the registry ``app.build_registry`` makes. kopf and the Kubernetes
client are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger("flexinfer.operator")


def configure(parser: argparse.ArgumentParser) -> None:
    """Flags of ``flexinfer operator``."""
    parser.description = ("Reconcile FlexInfer resources (Model, LoRAAdapter, ModelDeployment, ModelCache, "
                          "GPUGroup) into Deployments, Services, PVCs and Jobs.")
    a = parser.add_argument
    a("-n", "--namespace", action="append", default=[], metavar="NS",
      help="watch only this namespace (repeatable; glob patterns allowed); default: all namespaces")
    a("--peering", metavar="NAME", help="run with kopf peering NAME (one active operator among replicas); "
                                        "default: standalone")
    a("--priority", type=_priority, metavar="N|random",
      help="kopf peering priority (the highest live one is active; equal ones all pause, so identical "
           "replicas pass 'random'); default 0")
    a("--liveness", default="http://0.0.0.0:8081/healthz", metavar="URL",
      help="liveness endpoint served by kopf (empty: none); default %(default)s")
    a("--kubeconfig", help="kubeconfig outside a cluster (default: $KUBECONFIG, then ~/.kube/config)")
    a("--resync", type=float, help="seconds between reconciles of an unchanged object (FLEXINFER_OPERATOR_RESYNC)")
    a("--workers", type=int, help="concurrent reconciles per kind (FLEXINFER_OPERATOR_WORKERS)")
    a("--request-timeout", type=float, help="seconds per API request (FLEXINFER_OPERATOR_REQUEST_TIMEOUT)")
    a("--metrics-port", type=int, help="Prometheus /metrics port, 0 = off (FLEXINFER_OPERATOR_METRICS_PORT, "
                                       "default 8080)")


def _priority(raw: str) -> int:
    """``--priority``: an integer, or ``random`` (a fresh 1..2**31-1 per process, so replicas differ)."""
    if raw == "random":
        import secrets

        return 1 + secrets.randbelow(2**31 - 1)
    try:
        return int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'random', got {raw!r}") from None


def run(args: argparse.Namespace) -> int:
    """Run until interrupted; exit 0 on a clean stop, 1 on bad settings, 2 on an unusable kubeconfig."""
    import os

    import kopf

    from flexinfer.operator.app import build_registry
    from flexinfer.operator.config import load_settings
    from flexinfer.operator.context import Operator
    from flexinfer.settings import SettingsError

    try:
        settings = load_settings(None, resync_s=args.resync, workers=args.workers,
                                 request_timeout_s=args.request_timeout,
                                 metrics_port=getattr(args, "metrics_port", None))
    except SettingsError as e:
        print(f"operator: error: {e}")
        return 1
    from flexinfer.k8s.client import kubeconfig_problem

    if (why := kubeconfig_problem(args.kubeconfig)) is not None:
        print(f"operator: error: {why}")  # before kopf starts: it would retry its login forever
        return 2
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # kopf's kubeconfig login reads it
    op = Operator(settings=settings)
    registry = build_registry(op, kubeconfig=args.kubeconfig)
    namespaces = list(args.namespace or [])
    kopf.run(registry=registry, clusterwide=not namespaces, namespaces=namespaces,
             standalone=args.peering is None, peering_name=args.peering, priority=args.priority,
             liveness_endpoint=args.liveness or None)
    return 0
