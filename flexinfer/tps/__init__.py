"""The bench runner, ``flexinfer bench``: tps = tokens per second (plus TTFT and latency) of one model.

It measures a model through the FlexInfer proxy or directly against any OpenAI-compatible ``/v1``
base URL, reports it (text, ``--json``, ``--csv``, ``--plot``) and, in a cluster, publishes it to
ConfigMaps for the operator and the scheduler extender (``shared/reference/flexinfer-upstream.md``
§7.1; the key scheme lives in :mod:`flexinfer.labels`). The parts, each with its own module:

- :mod:`flexinfer.tps.command`: the command (flags, exit codes, one-line errors);
- :mod:`flexinfer.tps.config`: :class:`BenchConfig` from env and flags, the error types;
- :mod:`flexinfer.tps.client`: the HTTP endpoint and one timed request;
- :mod:`flexinfer.tps.stats`: samples, results, tokens/s and percentiles (pure);
- :mod:`flexinfer.tps.measure`: readiness, warm-up and the iteration loop (:func:`run_bench`);
- :mod:`flexinfer.tps.report`: text, CSV and plot output;
- :mod:`flexinfer.tps.publish`: the ConfigMap writer (``kubernetes_asyncio``, the ``kube`` extra,
  imported only there and only when ``--configmap`` is given).

This package's ``__all__`` is the bench runner's public API. No module of the bench runner may be
imported by the proxy.
"""

from __future__ import annotations

from flexinfer.tps.client import Endpoint, measure_once
from flexinfer.tps.command import configure, run
from flexinfer.tps.config import BenchConfig, BenchError, load_config
from flexinfer.tps.measure import run_bench
from flexinfer.tps.report import to_csv, to_text, write_plot
from flexinfer.tps.stats import BenchResult, Sample, percentile

__all__ = ["BenchConfig", "BenchError", "BenchResult", "Endpoint", "Sample", "configure", "load_config",
           "measure_once", "percentile", "run", "run_bench", "to_csv", "to_text", "write_plot"]
