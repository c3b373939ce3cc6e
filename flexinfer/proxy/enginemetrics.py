"""Engine metrics: what an engine's Prometheus page (and its ``/v1/models``) says about its load.

Owns: :class:`EngineState` (one scrape's reading of one endpoint), :func:`parse` (a ``/metrics``
page of vLLM, SGLang or the llama.cpp server -> EngineState), :func:`parse_adapters` (a
``/v1/models`` body -> the LoRA adapters loaded) and :func:`fresh` (is a state recent enough to be
believed).
Must not: do I/O, keep state between calls (the previous scrape is passed in), raise on any page
(a bad page is an ``EngineState`` with ``error`` set), or spend more than a bounded amount of work on
a page (a page longer than ``max_bytes`` is not parsed at all).

Recognised series (summed over their label sets, so one page serving several models, or vLLM's
data-parallel ``engine="N"`` ranks, reads as one endpoint; the KV usage is the *maximum* over the
label sets, never a sum, so it stays in 0..1 and never looks emptier than its fullest cache):

=========  ==============================  ===========================  ==============================
engine     waiting                         running                      kv_usage (0..1)
=========  ==============================  ===========================  ==============================
vllm       vllm:num_requests_waiting       vllm:num_requests_running    vllm:kv_cache_usage_perc, else
                                                                        vllm:gpu_cache_usage_perc (v0)
sglang     sglang:num_queue_reqs           sglang:num_running_reqs      sglang:token_usage
llamacpp   llamacpp:requests_deferred      llamacpp:requests_processing llamacpp:kv_cache_usage_ratio
=========  ==============================  ===========================  ==============================

TTFT and TPOT come from the ``_sum`` and ``_count`` of the engines' histograms
(``<prefix>:time_to_first_token_seconds``; ``<prefix>:inter_token_latency_seconds``, else the older
``<prefix>:time_per_output_token_seconds``): the mean over the scrape interval is the delta of the
sums over the delta of the counts since ``previous``. A counter that went down (engine restart) or
a first scrape counts everything since the engine started as the interval (Prometheus' ``rate``
reading of a reset). An interval with no new observations keeps the previous mean (an idle engine
keeps its last known latency rather than becoming "unknown"). Buckets are never read.

How the scheduler must read a state (unknown never looks idle):

- ``None`` (no state) or ``not fresh(state, now)``: *unknown*. Not zero load, not zero latency.
  A scorer gives an unknown endpoint the score of the worst known candidate (or a neutral middle
  one) and a filter never drops or prefers it on its metrics; it is ranked on the proxy's own
  counters alone.
- a field that is ``None`` (the engine does not export it, or the page was bad): unknown for that
  dimension only, same rule.
- ``error`` set: the scrape failed; the fields are ``None`` and only ``adapters`` and the
  histogram totals (so the next good scrape's deltas stay right) are carried over.

Only the lines of the series above are parsed in full (:func:`read_sample`: the name, a label set
with the format's escapes and no name twice, a value Python's ``float`` reads, an optional numeric
timestamp; anything else makes the page malformed); every other line is checked for a sample's shape with one regex and
dropped, so a page with thousands of buckets or unknown series costs one pass of string work, and
at most :data:`MAX_SERIES` samples are parsed. (Not ``prometheus_client.parser``: importing it
imports that package's web server and push client, 4 MB of the proxy's resident memory; the tests
check both parsers read the same pages alike.)
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

__all__ = ["MAX_BYTES", "MAX_SERIES", "EngineState", "fresh", "parse", "parse_adapters", "read_sample"]

#: Default byte limit of a page: larger pages are an error ("too_large") and are not parsed.
MAX_BYTES = 1 << 20
#: At most this many samples of the recognised series go through prometheus_client's parser (about
#: 25 us each): more is an error ("too_large"). A real page has tens (a few per model and DP rank).
MAX_SERIES = 1024

# role -> per-engine names; the first name found per role wins where several are listed
_WAITING = {"vllm": ("vllm:num_requests_waiting",), "sglang": ("sglang:num_queue_reqs",),
            "llamacpp": ("llamacpp:requests_deferred",)}
_RUNNING = {"vllm": ("vllm:num_requests_running",), "sglang": ("sglang:num_running_reqs",),
            "llamacpp": ("llamacpp:requests_processing",)}
_KV = {"vllm": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), "sglang": ("sglang:token_usage",),
       "llamacpp": ("llamacpp:kv_cache_usage_ratio",)}
_TTFT = {"vllm": ("vllm:time_to_first_token_seconds",), "sglang": ("sglang:time_to_first_token_seconds",),
         "llamacpp": ()}
_TPOT = {"vllm": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
         "sglang": ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
         "llamacpp": ()}
_ENGINES = ("vllm", "sglang", "llamacpp")

_GAUGES = frozenset(n for table in (_WAITING, _RUNNING, _KV) for names in table.values() for n in names)
_HISTS = frozenset(n for table in (_TTFT, _TPOT) for names in table.values() for n in names)
_WANTED = _GAUGES | frozenset(h + s for h in _HISTS for s in ("_sum", "_count"))

# a sample line starts with a metric name followed by labels, a blank or a tab
_METRIC = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"{_METRIC}(?=[{{ \t])")
_LABEL_NAME = r"(?!__)[a-zA-Z_][a-zA-Z0-9_]*"
_LABEL_VALUE = r'"(?:[^"\\\n]|\\[^\n])*"'  # a backslash escapes any character, as Prometheus reads them
_PAIR = rf"[ \t]*{_LABEL_NAME}[ \t]*=[ \t]*{_LABEL_VALUE}[ \t]*"
#: a whole sample line (stripped): name, label set (checked, not kept; no name twice), value,
#: optional timestamp (a number)
_LINE = re.compile(rf"({_METRIC})(?:[ \t]*\{{((?:{_PAIR}(?:,{_PAIR})*,?[ \t]*)?)\}}[ \t]*|[ \t]+)"
                   r"([^ \t_]+)(?:[ \t]+([^ \t_]+))?\Z")
#: the label names of a label set that ``_LINE`` matched
_LABEL_NAMES = re.compile(rf"({_LABEL_NAME})[ \t]*=[ \t]*{_LABEL_VALUE}")


@dataclass(frozen=True, slots=True)
class EngineState:
    """One endpoint's engine as one scrape saw it. ``None`` means unknown (see the module doc)."""

    waiting: float | None
    running: float | None
    kv_usage: float | None  # 0..1
    ttft_s: float | None  # mean time to first token over the scrape interval
    tpot_s: float | None  # mean inter-token latency over the scrape interval
    engine: str  # "vllm" | "sglang" | "llamacpp" | "unknown"
    at: float  # monotonic time of the scrape
    adapters: frozenset[str] = frozenset()  # LoRA adapters loaded (from /v1/models)
    error: str | None = None  # "malformed" | "too_large" (parse); the scraper's reasons otherwise
    # cumulative (sum, count) of the histograms the means come from, for the next scrape's deltas
    ttft_total: tuple[float, float] | None = field(default=None, repr=False)
    tpot_total: tuple[float, float] | None = field(default=None, repr=False)


def fresh(state: EngineState | None, now: float, max_age: float = 2.0) -> bool:
    """True when ``state`` is a successful scrape at most ``max_age`` seconds old. Anything else is
    unknown, and unknown must never be read as idle (module doc)."""
    return state is not None and state.error is None and 0.0 <= now - state.at <= max_age


def failed(previous: EngineState | None, now: float, error: str) -> EngineState:
    """The state of a failed scrape: all unknown; adapters and histogram totals carried over."""
    return EngineState(None, None, None, None, None, "unknown", now,
                       previous.adapters if previous is not None else frozenset(), error,
                       previous.ttft_total if previous is not None else None,
                       previous.tpot_total if previous is not None else None)


def _mean(total: tuple[float, float] | None, prev_total: tuple[float, float] | None,
          prev_mean: float | None) -> float | None:
    if total is None:
        return None
    s, c = total
    if prev_total is not None:
        ds, dc = s - prev_total[0], c - prev_total[1]
        if dc < 0 or ds < 0:  # reset: everything since the restart is the interval
            ds, dc = s, c
    else:
        ds, dc = s, c
    if dc > 0:
        return ds / dc
    return prev_mean


def read_sample(line: str) -> tuple[str, float] | None:
    """(name, value) of one stripped sample line; None when the line is malformed (:data:`_LINE`,
    a label name given twice, a value or timestamp that is not a number)."""
    m = _LINE.match(line)
    if m is None:
        return None
    name, labels, value, stamp = m.groups()
    if labels:
        names = _LABEL_NAMES.findall(labels)
        if len(set(names)) != len(names):
            return None
    try:
        v = float(value)
        if stamp is not None:
            float(stamp)
    except ValueError:
        return None
    return name, v


def parse(text: str, previous: EngineState | None, now: float, max_bytes: int = MAX_BYTES,
          max_series: int = MAX_SERIES) -> EngineState:
    """Read a ``/metrics`` page. Never raises: a page over ``max_bytes`` characters or with more than
    ``max_series`` samples of the recognised series gives ``error="too_large"``, an unparsable one
    ``error="malformed"`` (see :func:`failed`)."""
    if len(text) > max_bytes:
        return failed(previous, now, "too_large")
    kept: list[str] = []
    for line in text.split("\n"):
        s = line.strip()
        if not s or s[0] == "#":
            continue
        m = _SAMPLE.match(s)
        if m is None:
            return failed(previous, now, "malformed")
        if m.group(0) in _WANTED:
            if len(kept) == max_series:
                return failed(previous, now, "too_large")
            kept.append(s)
    sums: dict[str, float] = {}
    maxes: dict[str, float] = {}
    for line in kept:
        sample = read_sample(line)
        if sample is None:
            return failed(previous, now, "malformed")
        name, v = sample
        if not math.isfinite(v) or v < 0:
            continue
        sums[name] = sums.get(name, 0.0) + v
        maxes[name] = max(maxes.get(name, 0.0), v)

    engine = next((e for e in _ENGINES if any(n in sums for n in _WAITING[e] + _RUNNING[e] + _KV[e])), None)
    if engine is None:
        engine = next((e for e in _ENGINES if any(h + "_count" in sums for h in _TTFT[e] + _TPOT[e])),
                      "unknown")
    if engine == "unknown":
        return EngineState(None, None, None, None, None, "unknown", now,
                           previous.adapters if previous is not None else frozenset())

    def first(names: tuple[str, ...], table: dict[str, float]) -> float | None:
        return next((table[n] for n in names if n in table), None)

    def total(names: tuple[str, ...]) -> tuple[float, float] | None:
        for h in names:
            if h + "_count" in sums:
                return (sums.get(h + "_sum", 0.0), sums[h + "_count"])
        return None

    kv = first(_KV[engine], maxes)
    if kv is not None:
        kv = min(kv, 1.0)
    same = previous is not None and previous.engine == engine
    ttft_total, tpot_total = total(_TTFT[engine]), total(_TPOT[engine])
    return EngineState(
        waiting=first(_WAITING[engine], sums),
        running=first(_RUNNING[engine], sums),
        kv_usage=kv,
        ttft_s=_mean(ttft_total, previous.ttft_total if same and previous else None,
                     previous.ttft_s if same and previous else None),
        tpot_s=_mean(tpot_total, previous.tpot_total if same and previous else None,
                     previous.tpot_s if same and previous else None),
        engine=engine,
        at=now,
        adapters=previous.adapters if previous is not None else frozenset(),
        ttft_total=ttft_total,
        tpot_total=tpot_total,
    )


def parse_adapters(body: bytes) -> frozenset[str] | None:
    """The LoRA adapters an OpenAI ``/v1/models`` body lists, or None when it is not such a body.

    vLLM (and SGLang) list every served name with ``"parent": null`` and every LoRA adapter with
    ``"parent": "<base model>"`` (its ``"root"`` is the adapter's path). An entry is an adapter when
    its ``parent`` is a string other than its own id, or, where an engine gives no ``parent``, when
    its ``root`` names another entry's id. Engines that list only their model (llama.cpp) have none.
    """
    try:
        doc = json.loads(body)
        data = doc["data"] if isinstance(doc, dict) else None
        if not isinstance(data, list):
            return None
        ids = {e["id"] for e in data if isinstance(e, dict) and isinstance(e.get("id"), str)}
        out: set[str] = set()
        for e in data:
            if not isinstance(e, dict) or not isinstance(e.get("id"), str):
                continue
            mid = e["id"]
            parent, root = e.get("parent"), e.get("root")
            by_parent = isinstance(parent, str) and parent != "" and parent != mid
            by_root = "parent" not in e and isinstance(root, str) and root != mid and root in ids
            if by_parent or by_root:
                out.add(mid)
        return frozenset(out)
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
