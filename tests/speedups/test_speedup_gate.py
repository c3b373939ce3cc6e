"""CI gate: every compiled primitive must stay >= 3x faster than its Python twin (one: >= 2x).

Both twins are timed in the same run, interleaved, timeit style (the best of several repeats
of many calls, in thread CPU time so preemption does not count), and only their ratio is
checked, so a slow or busy machine does not fail it; a lost C fast path does. One
re-measure absorbs a burst of noise on a shared CPU.
Skips when the compiled twins are not built or are switched off.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType

import pytest

from flexinfer.http.request import _FRAMING_RULES

from .conftest import load

MIN_RATIO = 3.0
REPEATS = 7
# frame_chunk's compiled twin already costs about one call from a Python loop (measured in the
# loop below: 22.9 ns a call, against 21.5 ns for an empty Python function of two arguments and
# 15.9 ns for operator.add on the same bytes), so its ratio is the Python twin's cost over the
# cost of a call, which depends on the machine: 3.7-3.8 on the development box, 2.95 on a CI run
# that failed the 3x gate. A lost fast path (the twin's own expression, which the compiled twin
# falls back to) measures about 1x, so 2x still catches it.
MIN_RATIOS = {"frame_chunk(130 B event)": 2.0}


def _best(fn: Callable[[], object], number: int) -> float:
    # thread CPU time: time spent descheduled on a busy machine does not count
    start = time.thread_time()
    for _ in range(number):
        fn()
    return time.thread_time() - start


def measure(py_fn: Callable[[], object], c_fn: Callable[[], object], number: int) -> float:
    """py time / c time, each the best of REPEATS interleaved runs of ``number`` calls."""
    py_best = c_best = float("inf")
    py_fn()
    c_fn()
    for _ in range(REPEATS):
        py_best = min(py_best, _best(py_fn, number))
        c_best = min(c_best, _best(c_fn, number))
    return py_best / c_best


KEYS = [f"session-{i:05d}-{i * 7919 % 10007}" for i in range(500)]
NODES = [f"10.0.0.{i}:8000" for i in range(1, 17)]


def ring_get(mod: ModuleType) -> Callable[[], object]:
    get = mod.HashRing(NODES).get

    def run() -> None:
        for k in KEYS:
            get(k)

    return run


def ring_bounded(mod: ModuleType) -> Callable[[], object]:
    ring = mod.HashRing(NODES)
    loads = {node: i % 5 for i, node in enumerate(NODES)}
    get_bounded = ring.get_bounded
    keys = KEYS[:50]

    def run() -> None:
        for k in keys:
            get_bounded(k, loads)

    return run


def bucket_take(mod: ModuleType) -> Callable[[], object]:
    take = mod.TokenBucket(1e12, 1e12, now=0.0).take
    times = [i * 1e-3 for i in range(500)]

    def run() -> None:
        for t in times:
            take(1.0, t)

    return run


def registry_take(mod: ModuleType) -> Callable[[], object]:
    take = mod.BucketRegistry(1e12, 1e12).take
    pairs = [(KEYS[i % 50], i * 1e-3) for i in range(500)]

    def run() -> None:
        for key, t in pairs:
            take(key, 1.0, t)

    return run


PROMPT = ("You are a helpful assistant. Answer briefly and cite sources. " * 4000)[:220_000]


def prefix_hashes(mod: ModuleType) -> Callable[[], object]:
    fn = mod.chained_block_hashes

    def run() -> None:
        fn(PROMPT)

    return run


HEADS = [b"HTTP/1.1 200 OK\r\ndate: Wed, 02 Dec 2026 11:00:00 GMT\r\ncontent-type: application/json\r\n"
         b"x-request-id: %016x\r\ncontent-length: %d\r\n\r\n" % (i * 7919, i) for i in range(500)]


def head_check(mod: ModuleType) -> Callable[[], object]:
    fn = mod.head_lines_ok

    def run() -> None:
        for head in HEADS:
            fn(head, 6)

    return run


RESPONSE_HEADERS = [[(b"content-type", b"application/json"), (b"content-length", b"%d" % i),
                     (b"x-request-id", b"%016x" % (i * 7919)), (b"x-flexinfer-route", b"least_request;load;up:8000")]
                    for i in range(500)]
FRAMING_RULES = _FRAMING_RULES  # the rules the response writer passes (the response heads measured are its)


def head_building(mod: ModuleType) -> Callable[[], object]:
    fn = mod.head_block
    lead = (b"HTTP/1.1 200 OK\r\n", b"date: Wed, 02 Dec 2026 11:00:00 GMT\r\n")
    tail = (b"content-length: 2\r\n", b"", b"\r\n")

    def run() -> None:
        for headers in RESPONSE_HEADERS:
            fn(lead, headers, FRAMING_RULES, tail, 4)

    return run


EVENTS = [b'data: {"id":"chatcmpl-%d","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
          b'{"content":"tok%d"},"finish_reason":null}]}\n\n' % (i, i) for i in range(500)]


def chunk_framing(mod: ModuleType) -> Callable[[], object]:
    fn = mod.frame_chunk

    def run() -> None:
        for event in EVENTS:
            fn(b"", event)

    return run


def chunked_reading(mod: ModuleType) -> Callable[[], object]:
    """A 500-event stream's body in reads of four events, as a loaded proxy reads it."""
    wire = b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in EVENTS) + b"0\r\n\r\n"
    step = len(wire) // 125
    reads = [wire[i:i + step] for i in range(0, len(wire), step)]

    def run() -> None:
        body = mod.ChunkedBody(8192)
        for r in reads:
            body.feed(r)

    return run


CASES: dict[str, tuple[str, Callable[[ModuleType], Callable[[], object]], int]] = {
    "hashring.get": ("hashring", ring_get, 20),
    "hashring.get_bounded": ("hashring", ring_bounded, 10),
    "TokenBucket.take": ("tokenbucket", bucket_take, 20),
    "BucketRegistry.take": ("tokenbucket", registry_take, 20),
    "chained_block_hashes(220 KB)": ("prefixhash", prefix_hashes, 20),
    "head_lines_ok(200 B head)": ("headscan", head_check, 20),
    "frame_chunk(130 B event)": ("chunkframe", chunk_framing, 20),
    "head_block(4 headers)": ("headscan", head_building, 20),
    "ChunkedBody.feed(4-event reads)": ("bodyframe", chunked_reading, 5),
}


@pytest.mark.parametrize("case", list(CASES))
def test_compiled_twin_is_at_least_3x_faster(case: str) -> None:
    name, build, number = CASES[case]
    py_fn = build(load(name, "py"))
    c_fn = build(load(name, "c"))
    floor = MIN_RATIOS.get(case, MIN_RATIO)
    ratio = measure(py_fn, c_fn, number)
    if ratio < floor:  # one re-measure: a noisy neighbour, not a regression
        ratio = max(ratio, measure(py_fn, c_fn, number))
    assert ratio >= floor, f"{case}: compiled is only {ratio:.2f}x faster than Python (gate {floor}x)"
