"""Composition roots: the ``flexinfer proxy`` and ``flexinfer serve`` commands.

``cmd/`` holds the composition roots and is the only place that joins a runtime (static, local or
kube inventory) to the proxy's pipeline and hands the result to the HTTP server. Nothing imports
``cmd/`` except the ``flexinfer`` console script (:mod:`flexinfer.cli`) and tests.
"""
