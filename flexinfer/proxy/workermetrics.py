"""One /metrics for the N worker processes of ``flexinfer proxy --workers N``.

Owns: :class:`WorkerShare` (the snapshot file of one worker, ``<dir>/worker-<index>.snap``, the base
a restarted worker adopts, the merge of the workers' snapshots) and the merge rules below; the rows
it snapshots and the text it writes are :mod:`flexinfer.proxy.prom`'s.
Must not: define metrics (``metrics.py`` does), touch the per-request path (it runs on the tick and
on a scrape only), start threads or timers (the owner calls :meth:`WorkerShare.publish`), or make
or remove the directory (the supervisor makes it before the fork and removes it at the end).

How it works. Every worker publishes a snapshot of everything its registry collects (families with
type, help, unit and samples) to its own file: marshal into a temp file, then ``os.replace``, so a
reader sees a whole old or a whole new snapshot. It publishes on the server tick (at most once per
publish interval: :data:`PUBLISH_INTERVAL`, 1 s, unless told otherwise) and, always, right before
it answers a scrape; answering a scrape merges its fresh snapshot with the others' latest files.

Merge rules (per family, by its type):

- ``counter``, ``histogram``, ``summary``: every sample (``_total``, ``_bucket``, ``_count``,
  ``_sum``) is the sum over the workers; ``_created`` is the minimum.
- ``gauge`` named in :data:`SUMMED_GAUGES` (requests in flight, connections active, queue depth):
  the sum over the workers that are alive.
- any other gauge (and ``info``, ``stateset``, ``unknown``...): one series per worker, with a
  ``worker="<index>"`` label, for the workers that are alive. A gauge states something of *one*
  worker (say, "Redis degraded") unless it is declared a sum here.

A worker is alive while its process exists (``os.kill(pid, 0)``; the supervisor reaps its
children; a recycled pid keeps a dead worker's gauges only until its slot's successor starts, which
publishes at once). A dead worker's counters stay in the sums (its file stays); its gauges leave
them (its requests in flight are gone).

Why a scrape never goes backwards, whoever answers: a worker's published values only grow, and a
worker publishes before it answers, so the next scrape (answered by anyone) reads from every worker
a snapshot at least as new as the one the previous scrape used. Sums are added in worker-index
order whoever answers, so float sums (``_sum``) are monotonic too (rounded addition is monotonic in
each term). Restart: a restarted worker (same index, fresh counters) adopts the snapshot it finds
for its index as a base; its counters, histograms and ``_created`` continue from there (gauges do
not carry over). Increments between a dead worker's last publish and its death are lost (at most
one publish interval); nothing a scrape has shown is lost, since a worker publishes before it
answers. A worker that cannot write its file (disk full) shows itself, in its own scrapes too, as
of its last written snapshot (logged once), so the view stays the same whoever answers.

Timestamps and exemplars of samples are not carried (the proxy sets none). Labels keep the order
their collector gives (the same code in every worker); the writer sorts them. The directory must be private to the machine's processes (``tempfile.mkdtemp`` makes it
0700): marshal is fast and exact, not meant for data from strangers. One live process per index.
Nothing is fsync'ed: the files are for the processes of this machine, not for a reboot.
"""

from __future__ import annotations

import contextlib
import logging
import marshal
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any

from flexinfer.proxy.prom import Family, Labels, TextWriter, rows_of

__all__ = ["PUBLISH_INTERVAL", "SUMMED_GAUGES", "SUMMED_TYPES", "Snapshot", "WorkerShare", "merge", "read_snapshot"]

log = logging.getLogger("flexinfer.proxy.metrics")

#: Gauge families whose machine-wide value is the sum over the workers.
SUMMED_GAUGES = frozenset({
    "flexinfer_proxy_requests_in_flight",
    "flexinfer_proxy_active_connections",
    "flexinfer_proxy_queue_depth",
})
#: Family types whose samples add up over the workers (``_created`` aside: the minimum).
SUMMED_TYPES = frozenset({"counter", "histogram", "summary"})
#: The tick's publish writes at most this often (the tick runs faster when tests scale timeouts).
PUBLISH_INTERVAL = 1.0

_VERSION = 1

class Snapshot:
    """What one worker published: its index and pid, when, and its families."""

    __slots__ = ("families", "index", "pid", "time")

    def __init__(self, index: int, pid: int, when: float, families: list[Family]) -> None:
        self.index = index
        self.pid = pid
        self.time = when
        self.families = families

    def encode(self) -> bytes:
        return marshal.dumps((_VERSION, self.index, self.pid, self.time, self.families))

    @classmethod
    def decode(cls, data: bytes) -> Snapshot:
        version, index, pid, when, families = marshal.loads(data)
        if version != _VERSION:
            raise ValueError(f"snapshot version {version!r}")
        return cls(index, pid, when, families)


class _Merged:
    """Families being merged, in first-seen order."""

    __slots__ = ("families",)

    def __init__(self) -> None:
        #: name -> (type, help, unit, {(sample name, labels): value})
        self.families: dict[str, tuple[str, str, str, dict[tuple[str, Labels], float]]] = {}

    def fold(self, families: Iterable[Family], *, worker: str | None, gauges: bool) -> None:
        """Add one worker's families: summed types add up (``_created``: the minimum); gauges are
        summed (when ``worker`` is None or the family is a summed gauge), labelled
        ``worker=<worker>`` otherwise, or left out when ``gauges`` is false (the header stays)."""
        known = self.families
        for name, typ, doc, unit, samples in families:
            fam = known.get(name)
            if fam is None:
                fam = known[name] = (typ, doc, unit, {})
            values = fam[3]
            if fam[0] in SUMMED_TYPES:
                created = name + "_created"
                for sname, labels, v in samples:
                    key = (sname, labels)
                    old = values.get(key)
                    if old is None:
                        values[key] = v
                    elif sname == created:
                        if v < old:
                            values[key] = v
                    else:
                        values[key] = old + v
            elif not gauges:
                continue
            elif worker is None or name in SUMMED_GAUGES:
                for sname, labels, v in samples:
                    key = (sname, labels)
                    old = values.get(key)
                    values[key] = v if old is None else old + v
            else:
                tag = ("worker", worker)
                for sname, labels, v in samples:
                    values[(sname, (*labels, tag))] = v

    def rows(self) -> list[Family]:
        return [(name, typ, doc, unit, [(s, labels, v) for (s, labels), v in values.items()])
                for name, (typ, doc, unit, values) in self.families.items()]


def merge(snapshots: Iterable[Snapshot], alive: Iterable[bool] | None = None,
          writer: TextWriter | None = None) -> bytes:
    """The text exposition of ``snapshots`` merged by the rules of this module, added in the order
    given (pass them by worker index). ``alive`` (one per snapshot; all alive when omitted) says
    whose gauges count."""
    snaps = list(snapshots)
    live = list(alive) if alive is not None else [True] * len(snaps)
    acc = _Merged()
    for snap, ok in zip(snaps, live, strict=True):
        acc.fold(snap.families, worker=str(snap.index), gauges=ok)
    return (writer or TextWriter()).write(
        (name, typ, doc, values.items()) for name, (typ, doc, _unit, values) in acc.families.items())


def read_snapshot(path: str) -> Snapshot | None:
    """The snapshot in ``path``; None when there is none. Raises ``ValueError`` (or ``OSError``)
    when there is one that cannot be read."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    try:
        return Snapshot.decode(data)
    except (EOFError, TypeError) as exc:
        raise ValueError(str(exc)) from exc


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WorkerShare:
    """Worker ``index`` of ``count``: publishes its snapshot to ``directory``, merges all of them.

    Made after the fork, before serving. A snapshot already there for ``index`` (left by a dead
    predecessor) becomes the base this worker's summed families start from; the first snapshot is
    written at once (so the predecessor's gauges leave the view now).
    """

    def __init__(self, collector: Any, directory: str, index: int, count: int,
                 interval: float | None = None) -> None:
        if not 0 <= index < count:
            raise ValueError(f"worker index {index} not in 0..{count - 1}")
        self.collector = collector
        #: the least time between two unforced publishes
        self.interval = PUBLISH_INTERVAL if interval is None else interval
        self.index = index
        self.count = count
        self.paths = [os.path.join(directory, f"worker-{i}.snap") for i in range(count)]
        self.path = self.paths[index]
        self._tmp = f"{self.path}.tmp.{os.getpid()}"
        self._failing = False
        self._unreadable: set[str] = set()
        self._writer = TextWriter()
        os.makedirs(directory, exist_ok=True)
        stale = os.path.basename(self.path) + ".tmp."
        for name in os.listdir(directory):  # a predecessor killed mid-publish
            if name.startswith(stale):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(directory, name))
        base = self._read(self.path)
        #: the predecessor's summed families (its gauges dropped): what this worker's add to
        self.base: list[Family] = [f for f in base.families if f[1] in SUMMED_TYPES] if base else []
        self._published_at = 0.0
        self.last: Snapshot | None = None
        self.publish(force=True)

    def _rows(self) -> list[Family]:
        rows = rows_of(self.collector)
        if not self.base:
            return rows
        acc = _Merged()
        acc.fold(self.base, worker=None, gauges=False)
        acc.fold(rows, worker=None, gauges=True)
        return acc.rows()

    def publish(self, force: bool = False) -> Snapshot | None:
        """Write this worker's snapshot (temp file + atomic replace); unless ``force``, only when
        the last write is :attr:`interval` old. Returns the last snapshot that made it to the file
        (None before the first). An OSError is logged once (and its end once)."""
        now = time.monotonic()
        if not force and now - self._published_at < self.interval:
            return self.last
        self._published_at = now
        snap = Snapshot(self.index, os.getpid(), time.time(), self._rows())
        try:
            with open(self._tmp, "wb") as f:
                f.write(snap.encode())
            os.replace(self._tmp, self.path)
        except OSError as exc:
            if not self._failing:
                self._failing = True
                log.warning("metrics snapshot %s not written (%s): the machine's scrapes show this "
                            "worker as of its last snapshot", self.path, exc)
            return self.last
        if self._failing:
            self._failing = False
            log.warning("metrics snapshot %s written again", self.path)
        self.last = snap
        return snap

    def snapshots(self) -> Iterator[tuple[Snapshot, bool]]:
        """Every worker's latest snapshot and whether it is alive; this worker's is the last one
        it wrote (what the other workers read too, so a failed write cannot make the next scrape,
        answered by another worker, go backwards)."""
        for i, path in enumerate(self.paths):
            snap = self.last if i == self.index else self._read(path)
            if snap is not None:
                yield snap, _alive(snap.pid)

    def _read(self, path: str) -> Snapshot | None:
        """:func:`read_snapshot`, an unreadable one left out (logged once while it stays so)."""
        try:
            snap = read_snapshot(path)
        except (OSError, ValueError) as exc:
            if path not in self._unreadable:
                self._unreadable.add(path)
                log.warning("metrics snapshot %s unreadable (%s): left out", path, exc)
            return None
        self._unreadable.discard(path)
        return snap

    def render(self) -> bytes:
        """Publish now, then the merged text of every worker's latest snapshot."""
        self.publish(force=True)
        pairs = list(self.snapshots())
        return merge([s for s, _ in pairs], [a for _, a in pairs], self._writer)
