"""Request ids: 32 hex characters, unique in a process, a fresh prefix in a forked child."""

from __future__ import annotations

import os

from flexinfer.proxy.context import REQUEST_IDS, RequestIds


def test_ids_are_32_hex_and_distinct() -> None:
    ids = RequestIds()
    made = [ids.new() for _ in range(1000)]
    assert len(set(made)) == len(made)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in made)


def test_forked_child_reseeds() -> None:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.write(w, REQUEST_IDS.new())
        os._exit(0)
    os.close(w)
    child = os.read(r, 64)
    os.close(r)
    os.waitpid(pid, 0)
    assert child[:16] != REQUEST_IDS.new()[:16]


def test_ids_are_a_prefix_and_a_counter_in_lowercase_hex() -> None:
    ids = RequestIds()
    a, b = ids.new(), ids.new()
    assert a[:16] == b[:16] and a == a.lower() and b"-" not in a
    assert int(b[16:], 16) == int(a[16:], 16) + 1
