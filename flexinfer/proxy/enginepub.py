"""One engine scraper per machine: worker 0 publishes its scrapes in shared memory, the others read them.

Owns: the layout of the machine's engine-metrics region (:meth:`flexinfer.proxy.machine.MachineState.
engine_region`), :class:`EnginePublisher` (worker 0: writes its :class:`~flexinfer.proxy.scrape.
EngineScraper`'s states there after the scrapes finish) and :class:`EngineStateReader` (every other
worker: the scraper's reading interface, ``state(key)`` and ``last(key)``, over that region).
Must not: scrape, do I/O, block or take a lock (a reader never waits for the writer), or read a
state as fresher than its scrape (``at`` travels with it and the reader checks ``max_age``).

Layout: a 16-byte header ``<QII`` (sequence, payload length, CRC-32 of the payload), then the
payload: orjson ``{key: [good, last]}``, each an ``[waiting, running, kv_usage, ttft_s, tpot_s,
engine, at, sorted adapters, error]`` list or ``null`` (``last`` is ``0`` when it is ``good``).
``at`` is ``time.monotonic()``: CLOCK_MONOTONIC is one clock for the whole system on Linux, so the
reader's age of a state is the writer's.

Writing is a seqlock: the sequence is made odd, the payload and its length and CRC are written,
the sequence is made even (one higher). A reader decodes the JSON once per change and builds a key's
``EngineState`` the first time it is asked for it. One writer per machine (worker 0); a writer that died
mid-write leaves the sequence odd, and its successor (the restarted worker 0) goes on from there.

Reading. ``state(key)`` reads the 8-byte sequence (one ``unpack_from``); when it is what the
reader decoded last, the answer is a dict lookup and :func:`~flexinfer.proxy.enginemetrics.fresh`.
When it changed and is even, the reader copies the payload, reads the sequence again and checks the
CRC: a changed sequence or a bad CRC is a torn read (the writer was writing; the CRC catches what
store ordering could hide on a weakly ordered CPU), retried up to :data:`RETRIES` times, then the
reader keeps what it had and tries again on the next call. An odd sequence (a write in progress,
or a writer that died in it) keeps what it had, without copying. What it keeps ages like anything
else: once older than ``max_age`` it is unknown (``None``), never idle; so a dead worker 0's last
states go unknown in every worker 2 s after its last scrape, until its successor publishes.

Too big for the region: the writer publishes the endpoints that fit (in key order) and counts the
others in ``dropped`` (logged once per change of the figure): those read as unknown in the other
workers, which a scheduler must handle anyway, rather than everything going stale at once. The
default region (1 MiB) holds about 12,000 endpoints (~80 bytes each with two adapters; longer
adapter names cost their length).

Publishing is coalesced: a finished scrape schedules one write ``coalesce`` seconds later (20 ms),
so a round of scrapes that finish together is one write and one decode per reader.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from flexinfer.proxy.enginemetrics import EngineState, fresh

__all__ = ["HEADER", "RETRIES", "EnginePublisher", "EngineStateReader", "decode", "encode_entry"]

log = logging.getLogger("flexinfer.proxy.enginepub")

_HEAD = struct.Struct("<QII")  # sequence, payload length, crc32
_SEQ = struct.Struct("<Q")
HEADER = _HEAD.size
#: Copies a reader tries when the writer is writing at the same time, before keeping what it had.
RETRIES = 3

_Pair = tuple[EngineState | None, EngineState | None]


def _fields(st: EngineState | None) -> list[Any] | None:
    if st is None:
        return None
    return [st.waiting, st.running, st.kv_usage, st.ttft_s, st.tpot_s, st.engine, st.at, sorted(st.adapters),
            st.error]


def _state(f: Any) -> EngineState | None:
    if f is None:
        return None
    w, r, kv, ttft, tpot, engine, at, adapters, error = f
    return EngineState(w, r, kv, ttft, tpot, engine, at, frozenset(adapters), error)


def encode_entry(key: str, good: EngineState | None, last: EngineState | None) -> bytes:
    """One ``"key":[good,last]`` member of the payload."""
    return orjson.dumps(key) + b":" + orjson.dumps([_fields(good), 0 if last is good else _fields(last)])


def _pair(raw: Any) -> _Pair:
    g, last = raw
    good = _state(g)
    return good, good if last == 0 else _state(last)


def decode(payload: bytes) -> dict[str, _Pair]:
    """The payload -> ``{key: (last good, latest attempt)}``."""
    return {key: _pair(raw) for key, raw in orjson.loads(payload).items()}


class EnginePublisher:
    """Writes a scraper's states into the engine region (worker 0 only: one writer per region)."""

    def __init__(self, region: memoryview, snapshot: Callable[[], Mapping[str, _Pair]],
                 coalesce: float = 0.02) -> None:
        if len(region) <= HEADER:
            raise ValueError(f"the engine region needs more than {HEADER} bytes")
        self._region = region
        self._snapshot = snapshot
        self.coalesce = coalesce
        self._handle: asyncio.TimerHandle | None = None
        self.writes = 0  # payloads written
        self.dropped = 0  # endpoints left out of the last payload (too big for the region)

    @property
    def capacity(self) -> int:
        return len(self._region) - HEADER

    def changed(self) -> None:
        """The scraper's hook (``EngineScraper.on_change``): publish once, ``coalesce`` s from now."""
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_later(self.coalesce, self._flush)

    def _flush(self) -> None:
        self._handle = None
        self.publish()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def publish(self, states: Mapping[str, _Pair] | None = None) -> int:
        """Write ``states`` (default: the snapshot) now; returns the payload's length."""
        states = self._snapshot() if states is None else states
        cap = self.capacity
        payload = orjson.dumps({key: [_fields(g), 0 if last is g else _fields(last)]
                                for key, (g, last) in sorted(states.items())})
        if len(payload) <= cap:  # the usual case: one encode
            self.dropped = 0
            self.write(payload)
            return len(payload)
        parts: list[bytes] = []
        size = 2  # the braces
        dropped = 0
        for key in sorted(states):
            good, last = states[key]
            entry = encode_entry(key, good, last)
            extra = len(entry) + (1 if parts else 0)
            if size + extra > cap:
                dropped += 1
                continue
            parts.append(entry)
            size += extra
        payload = b"{" + b",".join(parts) + b"}"
        if dropped != self.dropped:
            if dropped:
                log.warning("engine states of %d endpoints do not fit the shared region (%d bytes); "
                            "the other workers read them as unknown", dropped, cap)
            self.dropped = dropped
        self.write(payload)
        return len(payload)

    def write(self, payload: bytes) -> None:
        """The seqlock write of one payload (at most :attr:`capacity` bytes)."""
        if len(payload) > self.capacity:
            raise ValueError("payload larger than the region")
        region = self._region
        (seq,) = _SEQ.unpack_from(region, 0)
        odd = seq + 1 if seq % 2 == 0 else seq + 2  # a predecessor that died mid-write left it odd
        _SEQ.pack_into(region, 0, odd)
        region[HEADER:HEADER + len(payload)] = payload
        _HEAD.pack_into(region, 0, odd, len(payload), zlib.crc32(payload))
        _SEQ.pack_into(region, 0, odd + 1)
        self.writes += 1


class EngineStateReader:
    """The scraper's reading interface (``state``, ``last``) over the engine region, in a worker
    that does not scrape. Decodes again only when the sequence changed (module doc)."""

    def __init__(self, region: memoryview, max_age: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if len(region) <= HEADER:
            raise ValueError(f"the engine region needs more than {HEADER} bytes")
        self._region = region
        self.max_age = max_age
        self._clock = clock
        self._seq = 0  # the sequence of what _states holds (0: nothing written yet)
        self._raw: dict[str, Any] = {}  # the decoded payload: key -> [good, last] lists
        self._states: dict[str, _Pair] = {}  # the EngineStates built from _raw, on first use per key
        self.torn = 0  # copies that changed under the reader (retried)
        self.decodes = 0

    def _refresh(self) -> None:
        region = self._region
        (seq,) = _SEQ.unpack_from(region, 0)
        if seq == self._seq:
            return
        for _ in range(RETRIES):
            if seq % 2:  # a write in progress (or a writer that died in it): keep what we have
                return
            _, length, crc = _HEAD.unpack_from(region, 0)
            payload = bytes(region[HEADER:HEADER + length]) if length <= len(region) - HEADER else b""
            (again,) = _SEQ.unpack_from(region, 0)
            if again == seq and length <= len(region) - HEADER and zlib.crc32(payload) == crc:
                try:
                    raw = orjson.loads(payload)
                    if not isinstance(raw, dict):
                        raise TypeError("not an object")
                except (orjson.JSONDecodeError, TypeError):  # cannot happen past the CRC
                    log.error("engine region holds an undecodable payload (sequence %d)", seq)
                    self._seq = seq
                    return
                self._raw, self._states, self._seq = raw, {}, seq
                self.decodes += 1
                return
            self.torn += 1
            seq = again

    def _get(self, key: str) -> _Pair | None:
        self._refresh()
        pair = self._states.get(key)
        if pair is None:
            raw = self._raw.get(key)
            if raw is None:
                return None
            try:
                pair = self._states[key] = _pair(raw)
            except (TypeError, ValueError):  # cannot happen for what EnginePublisher wrote
                return None
        return pair

    def state(self, key: str) -> EngineState | None:
        """Worker 0's last good scrape of ``key`` while fresh (``max_age``), else None: unknown."""
        pair = self._get(key)
        st = pair[0] if pair is not None else None
        return st if fresh(st, self._clock(), self.max_age) else None

    def last(self, key: str) -> EngineState | None:
        """Worker 0's latest scrape attempt of ``key``, failed or not, however old."""
        pair = self._get(key)
        return pair[1] if pair is not None else None

    @property
    def endpoints(self) -> list[str]:
        self._refresh()
        return list(self._raw)
