"""Bench runner reports of a finished :class:`~flexinfer.tps.stats.BenchResult`: the text summary,
one CSV row per iteration (``--csv``) and a PNG plot (``--plot``); :func:`emit` writes to a file or stdout.

``matplotlib`` (not a dependency) is imported only inside :func:`write_plot`. The ``--json`` document is
:meth:`BenchResult.summary`. This module formats; it must not measure or publish.
"""

from __future__ import annotations

import csv
import io
import sys

from flexinfer.tps.stats import BenchResult

CSV_FIELDS = ("iteration", "tokens", "chunks", "ttft_seconds", "decode_seconds", "latency_seconds",
              "tokens_per_second", "usage")


def to_csv(result: BenchResult) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    for i, s in enumerate(result.samples, 1):
        w.writerow([i, s.tokens, s.chunks, "" if s.ttft is None else f"{s.ttft:.5f}",
                    "" if s.decode_seconds is None else f"{s.decode_seconds:.5f}", f"{s.latency:.5f}",
                    f"{s.tokens_per_second:.3f}", int(s.usage)])
    return buf.getvalue()


def to_text(result: BenchResult) -> str:
    ttft = "n/a (non-stream)" if result.ttft_p50 is None else f"{result.ttft_p50 * 1000:.1f} ms"
    return (f"model {result.model} @ {result.base_url} ({'stream' if result.stream else 'non-stream'}): "
            f"{result.iterations} iterations, {result.completion_tokens} tokens in {result.duration_seconds:.1f} s\n"
            f"  tokens/s      {result.tokens_per_second:.2f} (decode)   {result.e2e_tokens_per_second:.2f} (end to end)\n"
            f"  TTFT p50      {ttft}\n"
            f"  latency       p50 {result.latency(50):.3f} s   p90 {result.latency(90):.3f} s   "
            f"p99 {result.latency(99):.3f} s\n")


def write_plot(result: BenchResult, path: str) -> None:
    """tokens/s per iteration and the latency distribution, as a PNG (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    xs = list(range(1, result.iterations + 1))
    ax1.plot(xs, [s.tokens_per_second for s in result.samples], marker="o")
    ax1.axhline(result.tokens_per_second, linestyle="--", color="gray",
                label=f"overall {result.tokens_per_second:.1f}")
    ax1.set(xlabel="iteration", ylabel="tokens/s", title=f"{result.model}: tokens/s per iteration")
    ax1.xaxis.get_major_locator().set_params(integer=True)
    ax1.legend()
    lat = [s.latency for s in result.samples]
    ax2.hist(lat, bins=min(30, max(5, len(lat) // 2)))
    for q, style in ((50, "-"), (90, "--"), (99, ":")):
        ax2.axvline(result.latency(q), linestyle=style, color="black", label=f"p{q} {result.latency(q):.2f} s")
    ax2.set(xlabel="latency (s)", ylabel="requests", title="latency distribution")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def emit(text: str, dest: str) -> None:
    """Write ``text`` to ``dest``: a file path, or ``-`` for stdout."""
    if dest == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        with open(dest, "w", encoding="utf-8") as fh:
            fh.write(text)
