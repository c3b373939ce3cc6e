"""The Kubernetes operator (kopf). Importing this package imports no Kubernetes client: its pure
modules (builders, desired-state rules) run without one. The shared-GPU leader choice it applies is
:mod:`flexinfer.sharing`, shared with the local runtime."""
