"""Tracing off vs on: proxy CPU time per request, the same tree in one run (docs/tracing.md).

Owns: an A/B of one source tree with ``PROXY_TRACING_ENABLED`` off (side "base") and on (side
"head"), through the benchmark gate's macro run (:func:`bench.gate.macro`: a fresh ``flexinfer
proxy`` per window on one core, the backend and wrk at a paced load on the other, sides alternated
A B / B A); with tracing on the spans go by OTLP/HTTP to a sink on the load core that answers 200
(so the exporter's real work, protobuf encoding and the POSTs, is in the proxy's CPU time).
``TRACE_SAMPLER_ARG``: the on side samples this ratio (``parentbased_traceidratio``; default 1.0,
every request). Knobs of the gate apply (``GATE_ROUNDS``, ``GATE_SECONDS``, ``GATE_RATE``).
Must not: edit tracked files; judge anything (it prints the figures; the gate judges HEAD vs baseline).
Run: ``python bench/bench_tracing.py`` (needs the otel extra and wrk).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import gate  # noqa: E402

_SINK = r"""
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def main() -> int:
    rounds = int(gate.env_float("GATE_ROUNDS", 4))
    seconds = gate.env_float("GATE_SECONDS", 3)
    warmup = gate.env_float("GATE_WARMUP", 1)
    ratio = os.environ.get("TRACE_SAMPLER_ARG", "1.0")
    sink_port = gate.free_port()
    load_core = "0"
    sink = subprocess.Popen(["taskset", "-c", load_core, sys.executable, "-c", _SINK, str(sink_port)])
    try:
        py = Path(sys.executable)
        off = gate.Side("base", ROOT, py, py.parent / "flexinfer", gate._side_env(ROOT))
        on_env = {**gate._side_env(ROOT), "PROXY_TRACING_ENABLED": "true",
                  "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink_port}",
                  "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": ratio}
        on = gate.Side("head", ROOT, py, py.parent / "flexinfer", on_env)
        gate.check_side(off)
        with tempfile.TemporaryDirectory() as tmp:
            out = gate.macro([off, on], rounds, seconds, warmup, Path(tmp))
    finally:
        sink.terminate()
        sink.wait(5)
    for kind in ("nonstream", "stream"):
        a = statistics.median(r["base"][f"{kind}_cpu_us"] for r in out)
        b = statistics.median(r["head"][f"{kind}_cpu_us"] for r in out)
        print(f"tracing {kind}: off {a:.1f} us/req, on (sampled {ratio}) {b:.1f} us/req, "
              f"on/off {b / a:.3f} (median of {rounds} rounds)")
    for q in ("ttfe_p50_ms", "ttfe_p99_ms"):
        a = statistics.median(r["base"][q] for r in out)
        b = statistics.median(r["head"][q] for r in out)
        print(f"tracing {q}: off {a:.2f}, on {b:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
