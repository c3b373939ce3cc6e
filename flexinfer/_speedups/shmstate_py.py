"""State shared by the forked worker processes of one machine, in a buffer they all map: the
reference twin (the executable spec).

Owns: the layout and the rules of three tables that live in a caller's writable buffer (an
anonymous ``MAP_SHARED`` mmap made before ``fork``, or a ``bytearray`` for one process):
``SharedBuckets`` (GCRA rate-limit buckets by key), ``SharedCounts`` (in-flight counts by key,
one row per worker) and ``SharedPrefixes`` (which endpoint served which prompt-block hash).
Must not: import anything from flexinfer, allocate or map shared memory itself, sleep, log,
or read the wall clock (``CLOCK_MONOTONIC`` only). ``shmstate_c.pyx`` implements the same API
with the same results; it uses ``__atomic`` compare-and-swap instead of the lock.

Buffers
-------
* Each class takes ``buf`` (anything with a writable, C-contiguous buffer) and the table's
  shape; ``size(...)`` is the number of bytes it uses, from the start of ``buf``. ``buf`` must
  be at least that long and 8-byte aligned (ValueError; TypeError when not writable). An mmap
  is page-aligned; give each table a slice at a multiple of 8 (``memoryview(m)[off:off + n]``).
* The buffer must be zero-filled when the first object is made over it (fresh anonymous
  mmaps and bytearrays are); objects in other processes attach to the same bytes.
* All words are native-endian 8-byte integers at 8-byte aligned offsets. An aligned 8-byte
  load or store is one access on every platform CPython supports, so a reader never sees
  half of a write (here: a memoryview ``"Q"``/``"q"`` item access; in C: ``__atomic``).
* Make the objects in each process after the fork (a ``SharedCounts`` must be, since its
  ``worker`` row is per process); an object inherited across a fork keeps its creator's
  local records, which every use re-validates, so that is harmless for the other two.
* ``close()`` (or leaving a ``with`` block) releases the buffer; the object is then unusable
  (ValueError). The mmap itself can only be closed after that.
* All processes sharing one buffer must use the same twin: the Python twin makes its
  read-modify-writes atomic with ``lock`` (any object with ``acquire()``/``release()``, e.g.
  a ``multiprocessing.Lock`` made before the fork; ``None`` means no locking, one process
  only), the compiled twin with CAS and ignores ``lock``.

Keys and slots (SharedBuckets, SharedCounts)
--------------------------------------------
* ``key_hash(key)``: FNV-1a 64 of ``key.encode("utf-8", "surrogatepass")``; 0 becomes 1,
  because a hash word of 0 marks an empty slot. Two keys with the same 64-bit hash share a
  slot (about one chance in 2**64 per pair).
* A key's slot: linear probing from ``key_hash % slots`` over ``min(PROBE, slots)`` slots
  (``PROBE`` = 16). A slot holding the key's hash is the key's; the first empty slot is
  claimed (its hash word set 0 -> h; in C a CAS, and a lost race re-reads the slot: the
  winner may have claimed it for the same key). Slots are never emptied again, so a lookup
  that only reads (``available``, ``get``) stops at the first empty slot.
* When the whole probe window holds other keys, the first *reclaimable* slot is taken over
  (its hash word old -> h): for buckets one whose TAT is ``<= now`` (an idle bucket is the
  same as a full one, so nothing is lost; the TAT is left as it is, which is already "full"),
  for counts one whose sum over all rows is 0. Else ``TableFull``.
* Each process keeps ``key -> slot`` in a local dict (at most one key per slot) and
  re-validates it on every use: the slot's hash word must still be the key's hash, because
  another process may have reclaimed the slot. A stale entry is dropped and the key looked
  up again.
* Races, worst cases. The first two are the compiled twin's only (the Python twin claims
  and charges under the lock); the third is both twins' (the counters take no lock):
  - a decision for bucket key A that validated its slot just before another process
    reclaimed it for B is charged to B: B's first decision may see one request more, and A
    (whose bucket was full) gets a fresh one; one decision per racing process, only for an
    idle bucket.
  - two processes reclaiming for the same new key at the same instant can claim two slots;
    each rescans the window after its claim and uses the first slot with the key's hash, so
    at worst one decision runs against the duplicate (idle, hence reclaimable again).
  - counts: an increment racing with a reclamation lands on the new key's slot; the worker
    that made it finds out on its next use of either key (see SharedCounts) and moves it.

SharedBuckets (GCRA)
--------------------
* Slot layout: 16 bytes, ``(key hash u64, TAT int64 ns of CLOCK_MONOTONIC)``; a new slot has
  TAT 0. ``size(slots) = 16 * slots``.
* ``take(key, rate, burst, n=1.0, now_ns=None)``: ``now = now_ns`` if given, else
  ``time.monotonic_ns()`` (the compiled twin reads ``CLOCK_MONOTONIC`` in C: the same value).
  ``cost = int(n * 1e9 / rate)`` and ``tol = int(burst * 1e9 / rate)`` (IEEE double, in this
  order, truncated toward 0). ``base = max(TAT, now)``, ``new = base + cost``. If
  ``new - now <= tol``: TAT = ``new`` (in C a CAS, retried on contention) and the answer is
  ``0.0`` (admitted). Else nothing is charged and the answer is the wait in seconds,
  ``float(new - now - tol) / 1e9`` (the integer difference converted first, then divided).
  ``n > burst`` is never admitted: ``inf`` at once (the table is not touched).
* Under overload (a request of ``n = 1`` always waiting) a full bucket admits exactly
  ``burst + floor(rate * T)`` requests over ``[t0, t0 + T]``, both ends included: ``burst``
  at ``t0``, then one every ``cost`` ns (exact for an integer ``burst`` and a whole number of
  ns in ``1e9 / rate``; else up to the ns truncation of ``cost`` and ``tol``). Machine-wide,
  since every worker charges the same TAT.
* ``charge(key, rate, burst, n, now_ns=None)``: a charge after the fact (token limits: the
  output tokens of a finished response, a correction of an estimate), with no admission check.
  ``n`` may be negative (a refund); NaN or an infinity is a ValueError. ``tol`` as in ``take``,
  ``cap = 2 * tol`` (the bucket never owes more than one burst), ``c = n * 1e9 / rate`` clamped to
  ``[-cap, cap]`` in double, then ``cost = int(c)``. ``ahead = min(max(TAT - now, 0), cap)``,
  ``new = min(max(ahead + cost, 0), cap)``; TAT = ``now + new`` (in C a CAS, retried), except
  that nothing is written when ``new == 0`` and ``TAT <= now`` (a refund to a full bucket). The
  answer is the debt wait ``float(new - tol) / 1e9`` when ``new > tol`` (any ``take`` waits at
  least that long), else ``0.0``. So a refund never makes a bucket fuller than full and one
  charge, however large, blocks the key for at most ``burst / rate`` seconds past empty.
* ``available(key, rate, burst, now_ns=None)``: ``burst - float(ahead) * rate / 1e9`` clamped
  at ``>= 0.0``, where ``ahead = max(TAT - now, 0)``; ``burst`` for an unknown key. Reads only.
* Validation (ValueError): ``rate`` and ``burst`` finite and ``> 0``, ``n >= 0`` (not NaN),
  ``burst * 1e9 / rate < 2**61`` (73 years), ``now_ns`` an integer in ``[0, 2**61)``. With these
  bounds no TAT arithmetic can overflow int64. The parameters are per call, so one table can
  hold buckets with different limits (a key should always be used with the same ones).

SharedCounts
------------
* Layout: ``slots`` u64 key hashes, then ``workers`` rows of ``slots`` int64 counters.
  ``size(slots, workers) = 8 * slots * (1 + workers)``. Row ``worker`` belongs to this
  process: only it writes there (plain aligned 8-byte stores, no atomics or lock); readers
  sum a slot's column over all rows.
* ``add(key, delta)`` adds to this worker's counter of ``key`` (claiming a slot for a new key:
  ``TableFull`` when none can be claimed); ``acquire`` / ``release`` are ``add(key, +1/-1)``.
  A counter must stay within int64 (OverflowError). Pair every release with an acquire in
  the same worker; a row may go negative, sums are clamped.
* The process remembers which key each of its row's counters belongs to. When a slot it
  counted in was reclaimed for another key (only while the slot's column summed to 0: its
  counter there was 0, or another row was negative, or in the race above), its next use of
  either key takes that count out of the slot and moves it to the old key's new slot; if no
  slot can be claimed for it, that count is dropped. A move may displace a third key's count,
  and so on: one ``add`` moves counts at most ``slots`` times, then drops the one in hand (two
  keys whose slots stay reclaimable because another row cancels their counts would otherwise
  take each other's slot forever).
* ``get(key)``: the key's slot's sum over all rows, clamped at ``>= 0``; 0 for an unknown
  key; claims nothing. ``own(key)``: this worker's counter of ``key``. ``own_items()``: this
  worker's non-zero counters by key. ``totals()``: ``{key hash: sum}`` of every used slot with
  a positive sum (for a process that knows no keys). ``loads(keys)``: ``[get(k) for k in keys]``.
  ``slot_of(key)``: the key's slot index or None (reads only).
* ``reset_worker(w)`` zeroes row ``w`` (the parent, after worker ``w`` died; also forgets this
  object's local records when ``w`` is its own row).

SharedPrefixes
--------------
* ``sets`` (a power of two) sets of 8 ways of u64 entries: one 64-byte cache line per set,
  ``size(sets) = 64 * sets``. Entry = ``(block_hash & ~0xFFFF) | ep_id``, 0 = empty; ``ep_id``
  in ``1..65535`` (ValueError).
* A block hash's set is ``block_hash & (sets - 1)``: its lowest bits, taken from the 16 that
  the entry does not store, so with ``sets <= 65536`` a match compares ``48 + log2(sets)``
  bits of the hash, none twice (the XXH3 hashes of ``chained_block_hashes`` are uniform in
  every bit). Hashes that differ only in the other low bits alias: a false hint, harmless.
* ``record(ep_id, hashes)``: for each hash, nothing when its entry is in its set, else it is
  written to the first empty way, else to way ``counter % 8`` where ``counter`` is this
  object's count of such evictions (deterministic, so the twins agree). ``forget(ep_id)``
  clears every entry of ``ep_id`` (a full scan; in C each clear is a CAS, so an entry written
  meanwhile by another process survives).
* ``match_len(ep_id, hashes)``: the longest ``i`` such that ``hashes[i - 1]`` was recorded for
  ``ep_id``, by binary search (the chain property: block ``i`` implies the earlier ones), as
  ``PrefixStore.match_len`` does.
* No lock, also in this twin: every write is one aligned 8-byte store. Two processes writing
  the same way lose one hint; an evicted earlier block makes a match shorter or a search
  land on a later recorded block. A hint only steers routing, so any of that is harmless.
  A hash must be an int in ``[0, 2**64)`` (OverflowError otherwise).
* ``match_lens(ep_ids, hashes)``: for each id, the longest ``i`` such that every one of
  ``hashes[:i]`` is recorded for it, in one walk from block 0: each block's set is read once for
  all the ids still matching, and the walk stops when none is (later hashes are not read, nor
  validated; no ids: ``[]``, no hash read). All ids are validated first. Equal to
  ``[match_len(e, hashes) for e in ep_ids]`` while no block of the prefix is missing; with a hole
  (an evicted earlier block) it is the shorter, exact answer (never longer than ``match_len``'s).
"""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Sequence
from operator import index
from types import TracebackType
from typing import Any, Protocol

__all__ = [
    "MAX_NS",
    "PROBE",
    "WAYS",
    "SharedBuckets",
    "SharedCounts",
    "SharedPrefixes",
    "TableFull",
    "key_hash",
]

PROBE = 16  # slots probed per key
WAYS = 8  # entries per prefix set (one 64-byte cache line)
MAX_NS = 1 << 61  # exclusive bound of now_ns and of burst / rate in ns
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_M64 = (1 << 64) - 1
_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1
_MAX_COUNT = 1 << 40  # bound of slots, workers and sets (ValueError above)
_TAG = _M64 ^ 0xFFFF  # the stored bits of a block hash
_MAX_NS_F = float(MAX_NS)
_INF = math.inf


class TableFull(Exception):
    """No slot could be found or claimed for a key."""


class Lock(Protocol):
    def acquire(self) -> Any: ...
    def release(self) -> Any: ...


def key_hash(key: str) -> int:
    """FNV-1a 64 of ``key``'s UTF-8 (surrogatepass); never 0 (0 marks an empty slot)."""
    if not isinstance(key, str):
        raise TypeError(f"a key must be a str, not {type(key).__name__}")
    h = _FNV_OFFSET
    for b in key.encode("utf-8", "surrogatepass"):
        h = ((h ^ b) * _FNV_PRIME) & _M64
    return h or 1


def _as_float(x: object) -> float:
    """float(x) for numbers only (no parsing of strings), like a C double argument."""
    if type(x) is float:
        return x
    if isinstance(x, str | bytes | bytearray):
        raise TypeError(f"must be a real number, not {type(x).__name__}")
    return float(x)  # type: ignore[arg-type]


def _count(x: object, name: str, low: int) -> int:
    v = index(x)  # type: ignore[arg-type]
    if v < low:
        raise ValueError(f"{name} must be >= {low}")
    if v > _MAX_COUNT:
        raise ValueError(f"{name} is too large")
    return v


def _attach(buf: Any, nbytes: int) -> memoryview:
    """A byte view of the first ``nbytes`` of ``buf``, checked writable, long enough, aligned."""
    whole = memoryview(buf)
    try:
        if whole.readonly:
            raise TypeError("the buffer must be writable")
        if not whole.c_contiguous:
            raise ValueError("the buffer must be C-contiguous")
        raw = whole.cast("B") if whole.format != "B" or whole.ndim != 1 else whole[:]
    finally:
        whole.release()
    if raw.nbytes < nbytes:
        have = raw.nbytes
        raw.release()
        raise ValueError(f"the buffer has {have} bytes, {nbytes} needed")
    anchor = ctypes.c_char.from_buffer(raw)
    address = ctypes.addressof(anchor)
    del anchor
    if address % 8:
        raw.release()
        raise ValueError("the buffer must be 8-byte aligned")
    view = raw[:nbytes]
    raw.release()
    return view


def _ns(now_ns: object) -> int:
    if now_ns is None:
        return time.monotonic_ns()
    now = index(now_ns)  # type: ignore[arg-type]
    if not 0 <= now < MAX_NS:
        raise ValueError("now_ns must be in [0, 2**61)")
    return now


def _limits(rate: object, burst: object) -> tuple[float, float]:
    r = _as_float(rate)
    b = _as_float(burst)
    if not 0.0 < r < _INF:
        raise ValueError("rate must be finite and > 0")
    if not 0.0 < b < _INF:
        raise ValueError("burst must be finite and > 0")
    return r, b


class _Table:
    """Key hashes in a buffer, and this process's validated ``key -> slot`` records."""

    __slots__ = ("_cache", "_expect", "_hashes", "_lock", "_owner", "_probe", "_raw", "_slots", "_stride")

    def __init__(self, raw: memoryview, slots: int, stride: int, lock: Lock | None) -> None:
        self._raw = raw
        self._hashes = raw.cast("Q")  # word s * stride is slot s's key hash
        self._slots = slots
        self._stride = stride
        self._probe = min(PROBE, slots)
        self._lock = lock
        self._cache: dict[str, int] = {}  # key -> slot, valid while hash word == _expect[slot]
        self._owner: list[str | None] = [None] * slots  # slot -> the key cached there
        self._expect: list[int] = [0] * slots

    @property
    def slots(self) -> int:
        return self._slots

    def __len__(self) -> int:
        """Slots in use."""
        hashes = self._hashes
        stride = self._stride
        return sum(1 for s in range(self._slots) if hashes[s * stride])

    def close(self) -> None:
        """Release the buffer; the object is unusable afterwards."""
        self._hashes.release()
        self._raw.release()

    def __enter__(self) -> Any:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _cached(self, key: str) -> int:
        """The key's validated cached slot, or -1."""
        s = self._cache.get(key)
        if s is not None and self._hashes[s * self._stride] == self._expect[s]:
            return s
        return -1

    def _find(self, h: int) -> int:
        """The slot holding ``h``, or -1; reads only (stops at the first empty slot)."""
        slots = self._slots
        hashes = self._hashes
        stride = self._stride
        s = h % slots
        for _ in range(self._probe):
            v = hashes[s * stride]
            if v == h:
                return s
            if v == 0:
                return -1
            s = s + 1 if s + 1 < slots else 0
        return -1

    def _lookup(self, key: str) -> int:
        """The key's slot without claiming one (cached or probed), or -1."""
        s = self._cached(key)
        if s >= 0:
            return s
        return self._find(key_hash(key))

    def _reclaimable(self, s: int, arg: int) -> bool:
        raise NotImplementedError

    def _claim(self, h: int, arg: int) -> int:
        """The slot for ``h``: its own, else the first empty one, else the first reclaimable
        one (``arg`` is what ``_reclaimable`` needs); TableFull when none."""
        slots = self._slots
        hashes = self._hashes
        stride = self._stride
        start = h % slots
        s = start
        for _ in range(self._probe):
            v = hashes[s * stride]
            if v == h:
                return s
            if v == 0:
                hashes[s * stride] = h
                return s
            s = s + 1 if s + 1 < slots else 0
        s = start
        for _ in range(self._probe):
            if hashes[s * stride] == h or self._reclaimable(s, arg):
                hashes[s * stride] = h
                return s
            s = s + 1 if s + 1 < slots else 0
        raise TableFull(f"no free slot among {self._probe} for this key")

    def _remember(self, key: str, h: int, s: int) -> None:
        """Record ``key`` at ``s`` (dropping its stale record and any other key's record at ``s``)."""
        prev = self._cache.get(key)
        if prev is not None and prev != s:
            self._owner[prev] = None
        old = self._owner[s]
        if old is not None and old != key:
            del self._cache[old]
        self._owner[s] = key
        self._expect[s] = h
        self._cache[key] = s


class SharedBuckets(_Table):
    """GCRA rate-limit buckets by key in a shared buffer (pure Python; see the module doc)."""

    __slots__ = ("_tat",)

    def __init__(self, buf: Any, slots: int, lock: Lock | None = None) -> None:
        slots = _count(slots, "slots", 1)
        raw = _attach(buf, 16 * slots)
        super().__init__(raw, slots, 2, lock)
        self._tat = raw.cast("q")  # word 2 * s + 1 is slot s's TAT

    @staticmethod
    def size(slots: int) -> int:
        """Bytes used by ``slots`` buckets."""
        return 16 * _count(slots, "slots", 1)

    def close(self) -> None:
        self._tat.release()
        super().close()

    def _reclaimable(self, s: int, arg: int) -> bool:
        return bool(self._tat[2 * s + 1] <= arg)

    def _slot(self, key: str, now: int) -> int:
        s = self._cached(key)
        if s < 0:
            h = key_hash(key)
            s = self._claim(h, now)
            self._remember(key, h, s)
        return s

    def take(self, key: str, rate: float, burst: float, n: float = 1.0, now_ns: int | None = None) -> float:
        """Charge ``n`` to ``key``: 0.0 when admitted, else the seconds to wait (nothing charged)."""
        if type(n) is not float:
            n = _as_float(n)
        rate, burst = _limits(rate, burst)
        if not n >= 0.0:
            raise ValueError("n must be >= 0")
        tol_f = burst * 1e9 / rate
        if not tol_f < _MAX_NS_F:
            raise ValueError("burst / rate must be under 2**61 ns")
        now = _ns(now_ns)
        if n > burst:
            return _INF
        cost = int(n * 1e9 / rate)
        tol = int(tol_f)
        lock = self._lock
        if lock is not None:
            lock.acquire()
        try:
            i = 2 * self._slot(key, now) + 1
            tat = self._tat[i]
            new = (tat if tat > now else now) + cost
            if new - now <= tol:
                self._tat[i] = new
                return 0.0
            return float(new - now - tol) / 1e9
        finally:
            if lock is not None:
                lock.release()

    def charge(self, key: str, rate: float, burst: float, n: float, now_ns: int | None = None) -> float:
        """Charge ``n`` (may be negative) to ``key`` without an admission check: the debt wait."""
        if type(n) is not float:
            n = _as_float(n)
        rate, burst = _limits(rate, burst)
        if not -_INF < n < _INF:
            raise ValueError("n must be finite")
        tol_f = burst * 1e9 / rate
        if not tol_f < _MAX_NS_F:
            raise ValueError("burst / rate must be under 2**61 ns")
        now = _ns(now_ns)
        if not isinstance(key, str):
            raise TypeError(f"a key must be a str, not {type(key).__name__}")
        tol = int(tol_f)
        cap = 2 * tol
        cap_f = 2.0 * tol_f
        c = n * 1e9 / rate
        if c > cap_f:
            c = cap_f
        elif c < -cap_f:
            c = -cap_f
        cost = int(c)
        lock = self._lock
        if lock is not None:
            lock.acquire()
        try:
            i = 2 * self._slot(key, now) + 1
            tat = self._tat[i]
            ahead = tat - now if tat > now else 0
            if ahead > cap:
                ahead = cap
            new = ahead + cost
            if new < 0:
                new = 0
            elif new > cap:
                new = cap
            if new or tat > now:
                self._tat[i] = now + new
        finally:
            if lock is not None:
                lock.release()
        return float(new - tol) / 1e9 if new > tol else 0.0

    def available(self, key: str, rate: float, burst: float, now_ns: int | None = None) -> float:
        """Tokens ``key`` has at ``now_ns`` (``burst`` when unknown); changes nothing."""
        rate, burst = _limits(rate, burst)
        now = _ns(now_ns)
        if not isinstance(key, str):
            raise TypeError(f"a key must be a str, not {type(key).__name__}")
        s = self._lookup(key)
        if s < 0:
            return burst
        tat = self._tat[2 * s + 1]
        ahead = tat - now if tat > now else 0
        x = burst - float(ahead) * rate / 1e9
        return x if x > 0.0 else 0.0


class SharedCounts(_Table):
    """In-flight counts by key, one row per worker, in a shared buffer (pure Python)."""

    __slots__ = ("_counts", "_row", "_worker", "_workers")

    def __init__(self, buf: Any, slots: int, workers: int, worker: int, lock: Lock | None = None) -> None:
        slots = _count(slots, "slots", 1)
        workers = _count(workers, "workers", 1)
        worker = index(worker)
        if not 0 <= worker < workers:
            raise ValueError("worker must be in [0, workers)")
        raw = _attach(buf, 8 * slots * (1 + workers))
        super().__init__(raw, slots, 1, lock)
        self._counts = raw.cast("q")  # word slots * (1 + w) + s is worker w's counter of slot s
        self._workers = workers
        self._worker = worker
        self._row = slots * (1 + worker)

    @staticmethod
    def size(slots: int, workers: int) -> int:
        """Bytes used by ``slots`` keys counted by ``workers`` workers."""
        return 8 * _count(slots, "slots", 1) * (1 + _count(workers, "workers", 1))

    @property
    def workers(self) -> int:
        return self._workers

    @property
    def worker(self) -> int:
        return self._worker

    def close(self) -> None:
        self._counts.release()
        super().close()

    def _sum(self, s: int) -> int:
        counts = self._counts
        slots = self._slots
        return sum(counts[slots * (1 + w) + s] for w in range(self._workers))

    def _reclaimable(self, s: int, arg: int) -> bool:
        return self._sum(s) == 0

    def _store(self, i: int, v: int) -> None:
        if not _I64_MIN <= v <= _I64_MAX:
            raise OverflowError("a counter must stay within int64")
        self._counts[i] = v

    def add(self, key: str, delta: int) -> None:
        """Add ``delta`` to this worker's counter of ``key``."""
        delta = index(delta)
        s = self._cached(key)
        if s >= 0:
            i = self._row + s
            self._store(i, self._counts[i] + delta)
            return
        lock = self._lock
        if lock is not None:
            lock.acquire()
        try:
            self._add_slow(key, delta)
        finally:
            if lock is not None:
                lock.release()

    def acquire(self, key: str) -> None:
        """One more in flight for ``key`` (this worker)."""
        s = self._cached(key)
        if s >= 0:
            i = self._row + s
            self._store(i, self._counts[i] + 1)
        else:
            self.add(key, 1)

    def release(self, key: str) -> None:
        """One less in flight for ``key`` (this worker)."""
        s = self._cached(key)
        if s >= 0:
            i = self._row + s
            self._store(i, self._counts[i] - 1)
        else:
            self.add(key, -1)

    def _add_slow(self, key: str, delta: int) -> None:
        """``add`` when ``key`` has no valid record (under the lock): move a stale count of it
        along, claim its slot, then move along a stale count of another key found there, and so
        on, at most ``slots`` times: past that (counts of keys that take each other's slots in
        turn, reclaimable because other rows cancel them) the count being moved is dropped."""
        if not isinstance(key, str):
            raise TypeError(f"a key must be a str, not {type(key).__name__}")
        counts = self._counts
        row = self._row
        moves = 0
        while True:
            carry = 0
            s = self._cache.get(key)
            if s is not None:  # its slot was reclaimed: its count there goes with it
                carry = counts[row + s]
                counts[row + s] = 0
                del self._cache[key]
                self._owner[s] = None
            h = key_hash(key)
            try:
                s = self._claim(h, 0)
            except TableFull:
                if moves:
                    return  # no room for the moved count: it is dropped (see the module doc)
                raise
            other = self._owner[s]
            moved = 0
            if other is not None and other != key:
                if self._expect[s] != h:  # another key's count, made before the slot was reclaimed
                    moved = counts[row + s]
                    counts[row + s] = 0
                # (else the two keys have one hash, hence one counter: it stays)
                del self._cache[other]
            self._owner[s] = key
            self._expect[s] = h
            self._cache[key] = s
            self._store(row + s, counts[row + s] + carry + delta)
            if not moved or other is None or moves == self._slots:
                return
            key, delta = other, moved
            moves += 1

    def get(self, key: str) -> int:
        """In flight for ``key`` over all workers (``>= 0``; 0 when unknown); claims nothing."""
        if not isinstance(key, str):
            raise TypeError(f"a key must be a str, not {type(key).__name__}")
        s = self._lookup(key)
        if s < 0:
            return 0
        total = self._sum(s)
        return total if total > 0 else 0

    def loads(self, keys: Sequence[str]) -> list[int]:
        """``[get(k) for k in keys]``."""
        get = self.get
        return [get(k) for k in keys]

    def own(self, key: str) -> int:
        """This worker's counter of ``key``."""
        s = self._cache.get(key)
        return 0 if s is None else int(self._counts[self._row + s])

    def own_items(self) -> dict[str, int]:
        """This worker's non-zero counters by key."""
        counts = self._counts
        row = self._row
        return {key: counts[row + s] for s, key in enumerate(self._owner) if key is not None and counts[row + s]}

    def totals(self) -> dict[int, int]:
        """``{key hash: sum over workers}`` of every used slot with a positive sum."""
        out: dict[int, int] = {}
        hashes = self._hashes
        for s in range(self._slots):
            h = hashes[s]
            if h:
                total = self._sum(s)
                if total > 0:
                    out[h] = total
        return out

    def slot_of(self, key: str) -> int | None:
        """The slot index of ``key`` when it has one, else None (claims nothing)."""
        if not isinstance(key, str):
            raise TypeError(f"a key must be a str, not {type(key).__name__}")
        s = self._lookup(key)
        return None if s < 0 else s

    def reset_worker(self, worker: int) -> None:
        """Zero row ``worker`` (after that worker died)."""
        worker = index(worker)
        if not 0 <= worker < self._workers:
            raise ValueError("worker must be in [0, workers)")
        counts = self._counts
        base = self._slots * (1 + worker)
        for i in range(base, base + self._slots):
            counts[i] = 0
        if worker == self._worker:
            self._cache.clear()
            self._owner = [None] * self._slots
            self._expect = [0] * self._slots


class SharedPrefixes:
    """Prompt-block hints by endpoint id in a shared set-associative table (pure Python)."""

    __slots__ = ("_entries", "_evictions", "_mask", "_raw", "_sets")

    def __init__(self, buf: Any, sets: int) -> None:
        sets = _sets(sets)
        self._raw = _attach(buf, 64 * sets)
        self._entries = self._raw.cast("Q")
        self._sets = sets
        self._mask = sets - 1
        self._evictions = 0

    @staticmethod
    def size(sets: int) -> int:
        """Bytes used by ``sets`` sets (a power of two)."""
        return 64 * _sets(sets)

    @property
    def sets(self) -> int:
        return self._sets

    def close(self) -> None:
        """Release the buffer; the object is unusable afterwards."""
        self._entries.release()
        self._raw.release()

    def __enter__(self) -> SharedPrefixes:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _has(self, h: int, ep: int) -> bool:
        if not 0 <= h <= _M64:
            raise OverflowError("a block hash must be in [0, 2**64)")
        base = (h & self._mask) * WAYS
        return (h & _TAG) | ep in self._entries[base : base + WAYS]

    def match_len(self, ep_id: int, hashes: Sequence[int]) -> int:
        """Longest ``i`` such that ``hashes[:i]`` were recorded for ``ep_id`` (binary search)."""
        ep = _ep(ep_id)
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._has(hashes[mid - 1], ep):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def match_lens(self, ep_ids: Sequence[int], hashes: Sequence[int]) -> list[int]:
        """Per id, the longest ``i`` with all of ``hashes[:i]`` recorded for it (one walk from block 0)."""
        eps = [_ep(e) for e in ep_ids]
        out = [0] * len(eps)
        alive = list(range(len(eps)))
        entries = self._entries
        mask = self._mask
        n = 0
        for h in hashes:
            if not alive:
                break
            if not 0 <= h <= _M64:
                raise OverflowError("a block hash must be in [0, 2**64)")
            tag = h & _TAG
            base = (h & mask) * WAYS
            ways = entries[base : base + WAYS].tolist()
            still = []
            for j in alive:
                if tag | eps[j] in ways:
                    still.append(j)
                else:
                    out[j] = n
            alive = still
            n += 1
        for j in alive:
            out[j] = n
        return out

    def record(self, ep_id: int, hashes: Sequence[int]) -> None:
        """Remember that ``ep_id`` served ``hashes``."""
        ep = _ep(ep_id)
        entries = self._entries
        mask = self._mask
        for h in hashes:
            if not 0 <= h <= _M64:
                raise OverflowError("a block hash must be in [0, 2**64)")
            entry = (h & _TAG) | ep
            base = (h & mask) * WAYS
            ways = entries[base : base + WAYS].tolist()
            if entry in ways:
                continue
            try:
                way = ways.index(0)
            except ValueError:
                way = self._evictions % WAYS
                self._evictions += 1
            entries[base + way] = entry

    def forget(self, ep_id: int) -> None:
        """Clear every entry of ``ep_id``."""
        ep = _ep(ep_id)
        entries = self._entries
        for i, e in enumerate(entries.tolist()):
            if e and (e & 0xFFFF) == ep:
                entries[i] = 0


def _sets(sets: object) -> int:
    n = index(sets)  # type: ignore[arg-type]
    if n < 1 or n & (n - 1) or n > _MAX_COUNT:
        raise ValueError("sets must be a power of two >= 1")
    return n


def _ep(ep_id: object) -> int:
    ep = index(ep_id)  # type: ignore[arg-type]
    if not 1 <= ep <= 0xFFFF:
        raise ValueError("ep_id must be in 1..65535")
    return ep
