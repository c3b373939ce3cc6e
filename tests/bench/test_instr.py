"""bench/instr.py's parts that run without valgrind: the gate backend's paced streams (a real
socket) and the reading of a callgrind output file."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.gate import free_port, wait_port
from bench.gate_backend import EVENTS, STREAM
from bench.instr import total_instructions

ROOT = Path(__file__).resolve().parents[2]
BODY = b'{"model":"m","stream":true}'
REQUEST = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY))


def _backend(*args: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "gate_backend.py"), "--port", str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc)
    except BaseException:
        proc.kill()
        raise
    return proc, port


def _stream(port: int, requests: int = 1) -> list[list[bytes]]:
    """The reads of ``requests`` streams asked one after the other on one keep-alive connection."""
    out: list[list[bytes]] = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        for _ in range(requests):
            s.sendall(REQUEST)
            reads: list[bytes] = []
            got = b""
            while not got.endswith(b"0\r\n\r\n"):
                piece = s.recv(65536)
                assert piece, "the backend closed mid-stream"
                reads.append(piece)
                got += piece
            out.append(reads)
    return out


@pytest.mark.parametrize("gap", ["0", "3"])
def test_a_stream_is_the_same_bytes_paced_or_not(gap: str) -> None:
    proc, port = _backend("--event-gap-ms", gap)
    try:
        streams = _stream(port, requests=2)  # keep-alive: the second stream follows the first
    finally:
        proc.kill()
        proc.wait()
    for reads in streams:
        assert b"".join(reads) == STREAM


def test_a_paced_stream_arrives_event_by_event() -> None:
    proc, port = _backend("--event-gap-ms", "5")
    try:
        t0 = time.monotonic()
        (reads,) = _stream(port)
        took = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
    # one write per event, 5 ms apart: the client sees (nearly) one read per event, not one burst
    assert len(reads) >= EVENTS // 2, len(reads)
    assert took >= (EVENTS - 1) * 0.005 * 0.8, took


def test_totals_are_the_sum_of_the_parts(tmp_path: Path) -> None:
    out = tmp_path / "callgrind.out"
    out.write_text("version: 1\ncmd: python\npart: 1\nevents: Ir\nsummary: 0\nfn=(1) f\n1 5\ntotals: 1200\n"
                   "part: 2\nevents: Ir\nfn=(1)\n1 7\ntotals: 34\n")
    assert total_instructions(out) == 1234


def test_a_file_without_totals_is_an_error(tmp_path: Path) -> None:
    out = tmp_path / "callgrind.out"
    out.write_text("version: 1\nevents: Ir\nsummary: 0\n")
    with pytest.raises(SystemExit, match="no totals"):
        total_instructions(out)
