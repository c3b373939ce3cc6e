"""/metrics across the workers of one machine: the merge rules on two ProxyMetrics of this process,
then real forked worker processes that count while they are scraped: every counter sample grows
(and every ``_created`` shrinks) across 20 scrapes whichever worker answers, the final sums are what
the workers counted, and a worker killed with SIGKILL and restarted in its slot makes nothing go
backwards."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from flexinfer.proxy import workermetrics
from flexinfer.proxy.metrics import PREFIX, ProxyMetrics

REQ = f"{PREFIX}_requests_total"
DUR = f"{PREFIX}_request_duration_seconds"
IN_FLIGHT = f"{PREFIX}_requests_in_flight"

Key = tuple[str, tuple[tuple[str, str], ...]]


def samples(text: bytes) -> dict[Key, tuple[str, float]]:
    """(sample name, sorted labels) -> (family type, value) of a text exposition."""
    out: dict[Key, tuple[str, float]] = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"duplicate sample {key}"
            out[key] = (fam.type, s.value)
    return out


def value(got: dict[Key, tuple[str, float]], name: str, **labels: str) -> float:
    return got[(name, tuple(sorted(labels.items())))][1]


def constant(x: object) -> Callable[[], object]:
    return lambda: x


def shared(tmp: Path, index: int, count: int = 2) -> ProxyMetrics:
    m = ProxyMetrics()
    m.share_across_workers(str(tmp), index, count)
    return m


# ---- the merge rules, two workers in this process ----------------------------------------------

def test_counts_add_histograms_merge_created_is_min_gauges_sum_or_carry_the_worker(tmp_path: Path) -> None:
    m1 = shared(tmp_path, 1)  # worker 1's series are made first: its _created are the older ones
    m1.count("a", 200)
    m1.count("a", 200)
    m1.count("b", 404)
    m1.model("a").observe_duration(0.003)
    m1.model("a").observe_duration(7.0)
    m1.model("a").in_flight = 3
    m1.queue_wait.labels("a").observe(0.3)
    m1.upstream_errors.labels("refused", "10.0.0.1:8000").inc(4)
    m0 = shared(tmp_path, 0)
    for _ in range(3):
        m0.count("a", 200)
    m0.model("a").observe_duration(0.003)
    m0.model("a").in_flight = 2
    m0.queue_wait.labels("a").observe(0.3)
    m0.queue_wait.labels("c").observe(50.0)
    m0.queue_depth.labels("a").set(4)
    m1.queue_depth.labels("a").set(1)
    for i, m in enumerate((m0, m1)):
        stats = SimpleNamespace(connections_active=10 + i, connections_total=100 * (i + 1),
                                rejections={"header_timeout": i + 1})
        m.bind_server_stats(constant(stats))
        state = Gauge(f"{PREFIX}_test_state", "A state of one worker.", registry=m.registry)
        state.set(5 + i)
    own = [samples(generate_latest(m.registry)) for m in (m0, m1)]  # each worker on its own
    m1.publish(force=True)  # (else m0 reads what m1 published at share time: up to a tick old)
    text = m0.render()
    assert m1.render() == text  # whoever answers
    got = samples(text)
    assert value(got, REQ, model="a", code="200") == 5
    assert value(got, REQ, model="b", code="404") == 1
    assert value(got, f"{PREFIX}_upstream_errors_total", reason="refused", endpoint="10.0.0.1:8000") == 4
    created = f"{PREFIX}_requests_created"
    firsts = [value(o, created, model="a", code="200") for o in own]
    assert value(got, created, model="a", code="200") == min(firsts)
    assert value(got, created, model="a", code="200") == value(own[1], created, model="a", code="200")
    assert value(got, f"{DUR}_bucket", model="a", le="0.005") == 2
    assert value(got, f"{DUR}_bucket", model="a", le="5.0") == 2
    assert value(got, f"{DUR}_bucket", model="a", le="10.0") == 3
    assert value(got, f"{DUR}_count", model="a") == 3
    assert value(got, f"{DUR}_sum", model="a") == pytest.approx(7.006)
    qw = f"{PREFIX}_queue_wait_seconds"
    assert value(got, f"{qw}_bucket", model="a", le="0.5") == 2
    assert value(got, f"{qw}_bucket", model="c", le="+Inf") == 1  # one worker's series only
    assert value(got, f"{qw}_bucket", model="c", le="30.0") == 0
    assert value(got, IN_FLIGHT, model="a") == 5
    assert value(got, f"{PREFIX}_queue_depth", model="a") == 5
    assert value(got, f"{PREFIX}_active_connections") == 21
    assert value(got, f"{PREFIX}_connections_total") == 300
    assert value(got, f"{PREFIX}_http_rejections_total", reason="header_timeout") == 3
    assert value(got, f"{PREFIX}_test_state", worker="0") == 5
    assert value(got, f"{PREFIX}_test_state", worker="1") == 6
    assert (f"{PREFIX}_test_state", ()) not in got
    assert got[(f"{PREFIX}_test_state", (("worker", "0"),))][0] == "gauge"


def test_a_restarted_worker_continues_from_its_predecessor_but_not_its_gauges(tmp_path: Path) -> None:
    m0, m1 = shared(tmp_path, 0), shared(tmp_path, 1)
    m0.count("a", 200)
    m1.count("a", 200)
    m1.count("a", 200)
    m1.model("a").observe_duration(0.2)
    m1.model("a").in_flight = 7
    m1.activations.labels("a", "success").inc()
    m0.publish(force=True)
    before = samples(m1.render())
    m1b = shared(tmp_path, 1)  # the same slot, fresh numbers: the predecessor's file is its base
    after = samples(m0.render())
    assert value(after, REQ, model="a", code="200") == 3
    assert value(after, f"{DUR}_count", model="a") == 1
    assert value(after, f"{PREFIX}_activations_total", model="a", result="success") == 1
    assert (IN_FLIGHT, (("model", "a"),)) not in after  # m1's gauge went with it; m1b has no "a" yet
    created = (f"{PREFIX}_requests_created", (("code", "200"), ("model", "a")))
    assert after[created] == before[created]
    m1b.count("a", 200)
    m1b.model("a").observe_duration(0.2)
    m1b.model("a").in_flight = 1
    got = samples(m1b.render())
    assert value(got, REQ, model="a", code="200") == 4
    assert value(got, f"{DUR}_count", model="a") == 2
    assert value(got, f"{DUR}_sum", model="a") == pytest.approx(0.4)
    assert value(got, IN_FLIGHT, model="a") == 1
    assert got[created] == before[created]  # the predecessor's (older) _created stays


def test_the_tick_publishes_at_most_once_an_interval(tmp_path: Path) -> None:
    m0, m1 = shared(tmp_path, 0), ProxyMetrics()
    m1.share_across_workers(str(tmp_path), 1, 2, publish_interval=3600.0)
    m1.count("a", 200)
    m1.publish()  # published at share time, under an interval ago: nothing written
    assert (REQ, (("code", "200"), ("model", "a"))) not in samples(m0.render())
    m1.publish(force=True)
    assert value(samples(m0.render()), REQ, model="a", code="200") == 1
    m1.count("a", 200)
    m1.render()  # a scrape always publishes first
    assert value(samples(m0.render()), REQ, model="a", code="200") == 2
    m2 = ProxyMetrics()
    m2.share_across_workers(str(tmp_path / "other"), 0, 1, publish_interval=0.0)
    m2.count("a", 200)
    m2.publish()  # an unforced publish writes once the interval is over
    snap = workermetrics.read_snapshot(str(tmp_path / "other" / "worker-0.snap"))
    assert snap is not None
    assert (REQ, (("model", "a"), ("code", "200")), 1) in dict((f[0], f[4]) for f in snap.families)[
        f"{PREFIX}_requests"]


def test_a_worker_that_cannot_write_shows_its_last_written_snapshot_everywhere(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    m0, m1 = shared(tmp_path, 0), shared(tmp_path, 1)
    m1.count("a", 200)
    m1.render()
    share = m1._share
    assert share is not None
    os.mkdir(share._tmp)  # the temp file cannot be opened: every write fails
    m1.count("a", 200)
    for m in (m1, m0, m1):
        assert value(samples(m.render()), REQ, model="a", code="200") == 1
    assert caplog.text.count("not written") == 1
    os.rmdir(share._tmp)
    assert value(samples(m1.render()), REQ, model="a", code="200") == 2
    assert value(samples(m0.render()), REQ, model="a", code="200") == 2
    assert "written again" in caplog.text


def test_an_unreadable_snapshot_is_left_out(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    m0 = shared(tmp_path, 0)
    m0.count("a", 200)
    (tmp_path / "worker-1.snap").write_bytes(b"not a snapshot")
    for _ in range(2):
        assert value(samples(m0.render()), REQ, model="a", code="200") == 1
    assert caplog.text.count("left out") == 1
    m1 = shared(tmp_path, 1)  # an unreadable predecessor: no base
    m1.count("a", 200)
    assert value(samples(m1.render()), REQ, model="a", code="200") == 2


def test_share_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        shared(tmp_path, 2, 2)
    m = shared(tmp_path, 0)
    with pytest.raises(RuntimeError):
        m.share_across_workers(str(tmp_path), 0, 2)
    unshared = ProxyMetrics()
    unshared.publish()
    assert not list(tmp_path.glob("*.tmp.*"))


# ---- real worker processes ---------------------------------------------------------------------

def _worker(directory: str, index: int, count: int, conn: Connection) -> None:
    """A forked worker: counts all the time, publishes on its "tick", answers commands."""
    m = ProxyMetrics()
    st = m.model("a")
    st.in_flight = 1
    m.share_across_workers(directory, index, count)
    counted = 0
    conn.send(counted)  # ready: published once
    counting = publishing = True
    while True:
        if counting:
            for _ in range(40):
                m.count("a", 200)
                st.observe_duration(0.001 * (counted % 50))
                m.upstream_retries.labels("a").inc()
                counted += 1
        if publishing:
            m.publish()
        if not conn.poll(0.002 if counting else None):
            continue
        cmd = conn.recv()
        if cmd == "render":
            conn.send_bytes(m.render())
        elif cmd == "freeze":  # publish, then keep counting without ever publishing again
            m.publish(force=True)
            publishing = False
            conn.send(counted)
        elif cmd == "final":  # stop counting, publish what was counted
            counting = False
            m.publish(force=True)
            conn.send(counted)
        elif cmd == "exit":
            conn.close()
            return


class Workers:
    """Forked workers in slots 0..count-1 over one snapshot directory."""

    def __init__(self, directory: Path, count: int) -> None:
        self.directory = str(directory)
        self.count = count
        self.ctx = multiprocessing.get_context("fork")
        self.procs: dict[int, BaseProcess] = {}
        self.conns: dict[int, Connection] = {}

    def start(self, index: int) -> None:
        ours, theirs = self.ctx.Pipe()
        p = self.ctx.Process(target=_worker, args=(self.directory, index, self.count, theirs), daemon=True)
        p.start()
        theirs.close()
        self.procs[index], self.conns[index] = p, ours
        assert ours.recv() == 0

    def ask(self, index: int, cmd: str) -> int:
        self.conns[index].send(cmd)
        got = self.conns[index].recv()
        assert isinstance(got, int)
        return got

    def scrape(self, index: int) -> dict[Key, tuple[str, float]]:
        self.conns[index].send("render")
        return samples(self.conns[index].recv_bytes())

    def kill(self, index: int) -> None:
        p = self.procs.pop(index)
        assert p.pid is not None
        os.kill(p.pid, signal.SIGKILL)
        p.join()  # reaped: its pid is gone
        p.close()
        self.conns.pop(index).close()

    def close(self) -> None:
        for index in list(self.procs):
            p, conn = self.procs.pop(index), self.conns.pop(index)
            try:
                conn.send("exit")
            except OSError:
                pass
            p.join(10)
            if p.exitcode is None:
                p.kill()
                p.join()
            conn.close()
            p.close()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    w = Workers(tmp_path, 2)
    try:
        yield w
    finally:
        w.close()


class Monotonic:
    """Every counter and histogram sample never smaller, every ``_created`` never larger, than
    in any earlier scrape."""

    def __init__(self) -> None:
        self.seen: dict[Key, float] = {}
        self.checked = 0

    def check(self, got: dict[Key, tuple[str, float]]) -> None:
        for key, (typ, v) in got.items():
            old = self.seen.get(key)
            if key[0].endswith("_created"):
                assert old is None or v <= old, f"{key}: _created {old} -> {v}"
            elif typ in ("counter", "histogram"):
                assert old is None or v >= old, f"{key}: {old} -> {v}"
            else:
                continue
            self.seen[key] = v
            self.checked += 1
        for key in self.seen:
            assert key in got, f"{key} left the view"


def test_scrapes_of_two_worker_processes_never_go_backwards(workers: Workers) -> None:
    workers.start(0)
    workers.start(1)
    rng = random.Random(13)
    order = [i % 2 for i in range(20)]
    rng.shuffle(order)
    mono = Monotonic()
    totals = []
    for index in order:
        got = workers.scrape(index)
        mono.check(got)
        assert value(got, IN_FLIGHT, model="a") == 2
        totals.append(value(got, REQ, model="a", code="200"))
    assert totals[-1] > totals[0]
    assert mono.checked > 20 * 20
    counted = [workers.ask(0, "final"), workers.ask(1, "final")]
    for index in (0, 1):
        got = workers.scrape(index)
        mono.check(got)
        assert value(got, REQ, model="a", code="200") == sum(counted)
        assert value(got, f"{DUR}_count", model="a") == sum(counted)
        assert value(got, f"{PREFIX}_upstream_retries_total", model="a") == sum(counted)
        assert value(got, IN_FLIGHT, model="a") == 2


def test_a_worker_killed_and_restarted_in_its_slot_sends_nothing_backwards(workers: Workers) -> None:
    workers.start(0)
    workers.start(1)
    mono = Monotonic()
    for index in (0, 1, 1, 0):
        mono.check(workers.scrape(index))
    frozen = workers.ask(1, "freeze")  # its last publish: what it counts from now on is lost
    got = workers.scrape(0)
    mono.check(got)
    workers.kill(1)
    got = workers.scrape(0)
    mono.check(got)
    assert value(got, IN_FLIGHT, model="a") == 1  # the dead worker's gauge left the sum
    workers.start(1)
    rng = random.Random(7)
    for _ in range(10):
        got = workers.scrape(rng.randrange(2))
        mono.check(got)
        assert value(got, IN_FLIGHT, model="a") == 2
    counted = [workers.ask(0, "final"), workers.ask(1, "final")]
    for index in (1, 0):
        got = workers.scrape(index)
        mono.check(got)
        assert value(got, REQ, model="a", code="200") == counted[0] + frozen + counted[1]
        assert value(got, f"{DUR}_count", model="a") == counted[0] + frozen + counted[1]
