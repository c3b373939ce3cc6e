"""The Kubernetes operator (kopf). Importing this package imports no Kubernetes client: the pure
modules (``sharing``, builders, desired-state rules) are shared with the local runtime."""
