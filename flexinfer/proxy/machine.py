"""The state the worker processes of one machine share: rate-limit buckets, in-flight counts, prefix hints.

Owns: laying the shared-memory primitives of :mod:`flexinfer._speedups` (``SharedBuckets``,
``SharedCounts``, ``SharedPrefixes``) and the engine-metrics region out in one anonymous
``MAP_SHARED`` mapping that the parent of ``flexinfer proxy --workers N`` creates before it forks
(children inherit it), binding a worker's view of it (its row of in-flight counters), and zeroing a
dead worker's row (the parent calls :meth:`MachineState.reset_worker` before it restarts the slot).
Also the router-facing adapters:
:class:`SharedLoad` (in-flight counts of the machine, plus other machines' counts from Redis when
sharing is on) and :class:`SharedPrefixStore` (the prefix-cache store every worker reads and writes).

Why shared memory and not a process that owns the state: a rate-limit decision or an in-flight
count is a few loads and one compare-and-swap on memory every worker maps (tens of nanoseconds, no
system call, nothing to wait for), where asking another process costs a round trip on every request
(see ``docs/workers.md``). The pure-Python twins take the lock made here for every read-modify-write.

Must not: do I/O, or be created after workers were forked (a child would not share it).
"""

from __future__ import annotations

import mmap
from collections.abc import Mapping, Sequence
from typing import Any

from flexinfer._speedups import SharedBuckets, SharedCounts, SharedPrefixes

__all__ = ["BUCKET_SLOTS", "COUNT_SLOTS", "ENGINE_BYTES", "PREFIX_SETS", "MachineState", "SharedLoad",
           "SharedPrefixStore", "WorkerState"]

#: Rate-limit buckets (the global one and one per model): far more than the models of any inventory.
BUCKET_SLOTS = 4096
#: Endpoints with an in-flight counter (slots of endpoints gone for good are reclaimed once all are used).
COUNT_SLOTS = 4096
#: Prefix-cache hint sets of 8 entries (64 bytes) each: 2 MiB, 262,144 block hashes.
PREFIX_SETS = 1 << 15
#: Bytes of the engine-metrics region (worker 0's scrapes, :mod:`flexinfer.proxy.enginepub`): about
#: 12,000 endpoints' states. Pages never touched cost no memory.
ENGINE_BYTES = 1 << 20


def _align(n: int) -> int:
    return (n + 63) & ~63


class WorkerState:
    """One process's view of the machine's shared state."""

    __slots__ = ("buckets", "counts", "index", "prefixes")

    def __init__(self, buckets: SharedBuckets, counts: SharedCounts, prefixes: SharedPrefixes,
                 index: int) -> None:
        self.buckets = buckets
        self.counts = counts
        self.prefixes = prefixes
        self.index = index


class MachineState:
    """The shared mapping of one machine; create it in the parent, :meth:`bind` it in each child."""

    def __init__(self, workers: int, *, bucket_slots: int = BUCKET_SLOTS, count_slots: int = COUNT_SLOTS,
                 prefix_sets: int = PREFIX_SETS, engine_bytes: int = ENGINE_BYTES) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.workers = workers
        self.bucket_slots = bucket_slots
        self.count_slots = count_slots
        self.prefix_sets = prefix_sets
        sizes = (SharedBuckets.size(bucket_slots), SharedCounts.size(count_slots, workers),
                 SharedPrefixes.size(prefix_sets), engine_bytes)
        offsets = []
        at = 0
        for s in sizes:
            offsets.append(at)
            at += _align(s)
        self._sizes = sizes
        self._offsets = offsets
        self.nbytes = at
        self._map = mmap.mmap(-1, at)  # anonymous, MAP_SHARED: a forked child sees the same pages
        self._view = memoryview(self._map)
        # a semaphore in shared memory: the pure-Python twins' read-modify-writes (the compiled
        # twins use atomic instructions and never touch it)
        import multiprocessing  # only with --workers N: a single process never loads it (its RSS)

        self.lock: Any = multiprocessing.get_context("fork").Lock()

    def _region(self, i: int) -> memoryview:
        return self._view[self._offsets[i]:self._offsets[i] + self._sizes[i]]

    def bind(self, index: int) -> WorkerState:
        """The view of worker ``index`` (0..workers-1)."""
        if not 0 <= index < self.workers:
            raise ValueError(f"worker index {index} out of 0..{self.workers - 1}")
        return WorkerState(SharedBuckets(self._region(0), self.bucket_slots, self.lock),
                           SharedCounts(self._region(1), self.count_slots, self.workers, index, self.lock),
                           SharedPrefixes(self._region(2), self.prefix_sets), index)

    def reader(self) -> SharedCounts:
        """In-flight counts for a process that only reads (sums over every worker's row)."""
        return SharedCounts(self._region(1), self.count_slots, self.workers, 0, self.lock)

    def engine_region(self) -> memoryview:
        """The engine-metrics region: worker 0 publishes its scrapes there, the others read them
        (:mod:`flexinfer.proxy.enginepub` owns the layout)."""
        return self._region(3)

    def reset_worker(self, index: int) -> None:
        """Zero worker ``index``'s in-flight row: its requests died with it (the parent calls this)."""
        self.reader().reset_worker(index)


class SharedLoad:
    """The router's in-flight counts: this machine's (shared memory, every worker) plus, when Redis
    sharing is on, every other machine's (``remote``: an object whose ``remote_in_flight`` mapping
    is replaced by its sync task)."""

    __slots__ = ("_counts", "_remote")

    def __init__(self, counts: SharedCounts, remote: Any = None) -> None:
        self._counts = counts
        self._remote = remote

    def acquire(self, key: str) -> None:
        self._counts.acquire(key)

    def release(self, key: str) -> None:
        self._counts.release(key)

    def get(self, key: str, default: int = 0) -> int:
        n = self._counts.get(key)
        if self._remote is not None:
            n += self._remote.remote_in_flight.get(key, 0)
        return n

    def loads(self, keys: Sequence[str]) -> list[int]:
        out = self._counts.loads(keys)
        if self._remote is not None:
            remote: Mapping[str, int] = self._remote.remote_in_flight
            if remote:
                out = [n + remote.get(k, 0) for n, k in zip(out, keys, strict=True)]
        return out

    def snapshot(self) -> dict[str, int]:
        """This worker's own open requests by endpoint (non-zero only)."""
        return self._counts.own_items()


class SharedPrefixStore:
    """:class:`flexinfer.proxy.routing.PrefixStore`'s interface over the machine's shared hint table:
    an endpoint's id is its in-flight counter slot (the same in every worker)."""

    __slots__ = ("_counts", "_hints")

    def __init__(self, hints: SharedPrefixes, counts: SharedCounts) -> None:
        self._hints = hints
        self._counts = counts

    def _id(self, ep: str, claim: bool) -> int | None:
        slot = self._counts.slot_of(ep)
        if slot is None and claim:
            try:
                self._counts.add(ep, 0)
            except Exception:  # TableFull: no hint for this endpoint, routing still works
                return None
            slot = self._counts.slot_of(ep)
        return None if slot is None else slot + 1

    def match_len(self, ep: str, hashes: Sequence[int]) -> int:
        ep_id = self._id(ep, False)
        return 0 if ep_id is None or not hashes else self._hints.match_len(ep_id, hashes)

    def match_lens(self, eps: list[str], hashes: Sequence[int]) -> list[int]:
        """``[match_len(e, hashes) for e in eps]`` in one walk over the table (an endpoint with no
        id, i.e. never recorded on this machine: 0); the table's ``match_lens`` says how a hole
        (an evicted earlier block) shortens a match."""
        if not hashes or not eps:
            return [0] * len(eps)
        slot_of = self._counts.slot_of
        ids: list[int] = []
        where: list[int] = []
        for i, e in enumerate(eps):
            slot = slot_of(e)
            if slot is not None:
                ids.append(slot + 1)
                where.append(i)
        out = [0] * len(eps)
        if ids:
            for i, n in zip(where, self._hints.match_lens(ids, hashes), strict=True):
                out[i] = n
        return out

    def record(self, ep: str, hashes: Sequence[int]) -> None:
        if hashes:
            ep_id = self._id(ep, True)
            if ep_id is not None:
                self._hints.record(ep_id, hashes)

    def forget(self, ep: str) -> None:
        ep_id = self._id(ep, False)
        if ep_id is not None:
            self._hints.forget(ep_id)
