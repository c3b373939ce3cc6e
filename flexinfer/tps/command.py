"""The ``flexinfer bench`` command: its flags, exit codes and one-line errors.

:func:`configure` declares the flags (they override the environment), :func:`run` loads the
:class:`~flexinfer.tps.config.BenchConfig`, measures (:mod:`flexinfer.tps.measure`), writes the reports
(:mod:`flexinfer.tps.report`) and, with ``--configmap``, publishes (:mod:`flexinfer.tps.publish`,
imported only then). The bench runner's overview and public API are :mod:`flexinfer.tps`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import sys

from flexinfer.errors import report_failure
from flexinfer.settings import SettingsError
from flexinfer.tps.config import DEFAULT_PROMPT, BenchError, load_config
from flexinfer.tps.measure import run_bench
from flexinfer.tps.report import emit, to_csv, to_text, write_plot

log = logging.getLogger("flexinfer.tps")


def configure(parser: argparse.ArgumentParser) -> None:
    """Flags of ``flexinfer bench``; they override the environment."""
    parser.description = ("Measure tokens/s, TTFT and latency of a model through the FlexInfer proxy or any "
                          "OpenAI-compatible endpoint.")
    a = parser.add_argument
    a("--base-url", help="OpenAI base URL, e.g. http://host:port/v1 (default: PROXY_URL, BENCHMARK_PROXY_URL, "
                         "or the in-cluster proxy Service)")
    a("--model", help="model name (MODEL_NAME; default: the only model /models lists)")
    a("--api-key", help="bearer token (BENCHMARK_API_KEY or OPENAI_API_KEY)")
    a("--warmup", type=int, help="unmeasured requests first (default 2)")
    a("--iterations", type=int, help="at least this many measured requests (default 5)")
    a("--min-duration", type=float, help="and at least this many seconds of measuring (default 30)")
    a("--max-tokens", type=int, help="max_tokens per request (default 128)")
    a("--prompt", help=f"user message (default {DEFAULT_PROMPT!r})")
    a("--no-stream", dest="stream", action="store_const", const=False,
      help="non-streaming requests: tokens/s from usage.completion_tokens and wall time")
    a("--timeout", type=float, help="per-request socket timeout in seconds (default 180)")
    a("--ready-timeout", type=float, help="how long the first request waits for readiness (default 300)")
    a("--json", nargs="?", const="-", metavar="PATH", help="write the result as JSON (stdout if no PATH)")
    a("--csv", nargs="?", const="-", metavar="PATH", help="write one CSV row per iteration (stdout if no PATH)")
    a("--plot", metavar="OUT.png", help="plot tokens/s per iteration and latencies (needs matplotlib)")
    a("--no-progress", action="store_true", help="no progress line on stderr")
    a("--configmap", help="in a cluster: write this per-deployment ConfigMap and the global one")
    a("--namespace", help="namespace of the ConfigMaps (POD_NAMESPACE)")
    a("--backend", help="canonical backend name for the result keys (BENCHMARK_BACKEND)")
    a("--device-class", help="device class for the keys, 'vendor=…,arch=…,vram=…,count=…,int4=…' "
                             "(default: from NODE_NAME's gpu.* labels)")
    a("--kubeconfig", help="kubeconfig outside a cluster (KUBECONFIG; in a pod the service account is used)")


def run(args: argparse.Namespace) -> int:
    """Exit 0 on success, 1 with a one-line message on failure."""
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print("bench: error: --plot needs matplotlib, which FlexInfer does not depend on: pip install matplotlib",
              file=sys.stderr)
        return 1
    try:
        cfg = load_config(None, base_url=args.base_url, model=args.model, api_key=args.api_key,
                          warmup=args.warmup, iterations=args.iterations, min_duration=args.min_duration,
                          max_tokens=args.max_tokens, prompt=args.prompt, stream=args.stream, timeout=args.timeout,
                          ready_timeout=args.ready_timeout, configmap=args.configmap, namespace=args.namespace,
                          backend=args.backend, device_class=args.device_class, kubeconfig=args.kubeconfig)
        result = run_bench(cfg, progress_out=None if args.no_progress else sys.stderr)
        to_stdout = "-" in (args.json, args.csv)
        if args.json:
            emit(json.dumps(result.summary(), indent=2) + "\n", args.json)
        if args.csv:
            emit(to_csv(result), args.csv)
        (sys.stderr if to_stdout else sys.stdout).write(to_text(result))
        if args.plot:
            write_plot(result, args.plot)
        if cfg.configmap:
            from flexinfer.tps.publish import publish

            entries = asyncio.run(publish(result, cfg))
            print(f"bench: wrote ConfigMap {cfg.configmap} and {cfg.global_configmap} keys "
                  f"{', '.join(sorted(entries))}", file=sys.stderr)
    except Exception as exc:  # no traceback for the user; --log-level debug shows it
        return report_failure("bench", exc, (BenchError, SettingsError, ConnectionError), log)
    return 0

