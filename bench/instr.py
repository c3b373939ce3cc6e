"""Instructions per proxied request, counted by callgrind: the proxy's deterministic cost.

Owns: one measurement the CPU-time harnesses cannot give on a shared 2-core box, whose speed moves by
up to 1.5x between runs (docs/benchmarks.md): the user-space instructions ``flexinfer proxy`` executes
per request, counted by valgrind's callgrind over a fixed number of requests on one keep-alive
connection, with counting switched on after a warm-up (``callgrind_control -i on``). Repeated runs
agree to about 1 %, so a change of a few percent in the request path's Python shows up where the
harnesses' CPU time cannot see it. It does not count the kernel (system calls, loopback TCP: about a
third of the proxy's CPU for plain requests, more for streams) nor anything that only appears under
concurrency (batching of reads, the collector, queueing): the peer harness measures those.

Modes (the backend is ``bench/gate_backend.py``):

* ``json``: a chat completion answered as one JSON body (Content-Length);
* ``stream``: an SSE stream of 35 events that the backend writes in one write (a burst);
* ``paced``: the same stream written one event per write, ``--gap-ms`` apart, so that each event
  reaches the proxy in a read of its own, as tokens from an engine do: the per-event relay cost
  is ``(paced - json) / 35`` roughly.

Run: ``python bench/instr.py [--modes json,stream,paced] [--requests 2000]`` (``make bench-instr``);
``--pythonpath DIR`` measures another checkout's build with this venv (an A/B against a worktree).
Needs valgrind (``make valgrind``). Must not: import flexinfer (it measures whichever tree it is
pointed at), or judge: it reports.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from bench.gate import free_port, wait_port  # noqa: E402
from bench.gate_backend import EVENTS  # noqa: E402

BODY = {"model": "bench-model", "messages": [{"role": "user", "content": "x" * 1000}], "max_tokens": 64}


def drive(port: int, body: bytes, n: int, stream: bool) -> None:
    """``n`` requests on one keep-alive connection; each answer is read whole and checked."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for _ in range(n):
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200 or (stream and not data.rstrip().endswith(b"data: [DONE]")):
            raise SystemExit(f"instr: bad answer {resp.status}: {data[:200]!r}")
    conn.close()


def total_instructions(out: Path) -> int:
    """The instructions a callgrind output file counted: the sum of its parts' ``totals:`` lines
    (the header's ``summary:`` is 0 when counting starts switched off)."""
    totals = [int(line.split()[1]) for line in out.read_text().splitlines() if line.startswith("totals:")]
    if not totals:
        raise SystemExit(f"instr: no totals in {out}")
    return sum(totals)


def measure(mode: str, requests: int, warmup: int, gap_ms: float, pythonpath: str | None,
            work: Path) -> dict[str, float]:
    backend_port, proxy_port = free_port(), free_port()
    gap = gap_ms if mode == "paced" else 0.0
    backend = subprocess.Popen([sys.executable, str(HERE / "gate_backend.py"), "--port", str(backend_port),
                                "--event-gap-ms", str(gap)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = work / f"callgrind.{mode}.out"
    config = work / "proxy.yaml"
    config.write_text(f"models:\n  - name: bench-model\n    endpoints: [http://127.0.0.1:{backend_port}]\n")
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
           sys.executable, "-c", "import sys; from flexinfer.cli import main; sys.exit(main())",
           "proxy", "-c", str(config), "--host", "127.0.0.1", "--port", str(proxy_port)]
    log = (work / f"proxy.{mode}.log").open("wb")
    # cwd: the work folder, not this checkout: ``python -c`` puts the cwd first on sys.path, ahead of
    # PYTHONPATH, which would import this checkout's flexinfer whatever --pythonpath says
    proxy = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=work)
    try:
        wait_port(backend_port, backend)
        wait_port(proxy_port, proxy, 180)  # (python under valgrind starts in 10-30 s)
        body = json.dumps({**BODY, "stream": mode != "json"}).encode()
        drive(proxy_port, body, warmup, mode != "json")
        subprocess.run(["callgrind_control", "-i", "on", str(proxy.pid)], check=True, stdout=subprocess.DEVNULL)
        drive(proxy_port, body, requests, mode != "json")
        subprocess.run(["callgrind_control", "-i", "off", str(proxy.pid)], check=True, stdout=subprocess.DEVNULL)
    finally:
        proxy.send_signal(signal.SIGINT)
        try:
            proxy.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proxy.pid, signal.SIGKILL)
            proxy.wait()
        backend.terminate()
        backend.wait()
        log.close()
    per_request = total_instructions(out) / requests
    row = {"mode": mode, "requests": requests, "instructions_per_request": round(per_request)}
    if mode == "paced":
        row["gap_ms"] = gap
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description="instructions per proxied request (callgrind)")
    ap.add_argument("--modes", default="json,stream,paced")
    ap.add_argument("--requests", type=int, default=2000, help="counted requests per mode (paced: a fifth)")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--gap-ms", type=float, default=1.0, help="paced mode: milliseconds between events")
    ap.add_argument("--pythonpath", default=None, help="measure this checkout's build (PYTHONPATH)")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    ap.add_argument("--keep", action="store_true", help="keep the callgrind files (callgrind_annotate them)")
    args = ap.parse_args()
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"instr: {tool} not found (make valgrind)")
    rows = []
    tmp = tempfile.mkdtemp(prefix="flexinfer-instr-")
    try:
        for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
            if mode not in ("json", "stream", "paced"):
                raise SystemExit(f"instr: unknown mode {mode!r}")
            n = max(1, args.requests // 5) if mode == "paced" else args.requests
            rows.append(measure(mode, n, args.warmup // 5 if mode == "paced" else args.warmup,
                                args.gap_ms, args.pythonpath, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        if args.keep:
            print(f"instr: callgrind files and proxy logs kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    by = {r["mode"]: r["instructions_per_request"] for r in rows}
    print("\n| mode | requests | instructions per request |\n|---|---:|---:|")
    for r in rows:
        print(f"| {r['mode']} | {r['requests']:,} | {r['instructions_per_request']:,} |")
    if "paced" in by and "stream" in by:
        print(f"\npaced - stream, per event: {(by['paced'] - by['stream']) / EVENTS:,.0f} instructions "
              "(the cost of an event in a read of its own)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
