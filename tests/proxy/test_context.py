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


def test_an_id_is_the_prefix_and_the_counter_as_16_hex_digits() -> None:
    """Both twins (the build writes the digits itself, context.pxd): the same id for the same state,
    the counter's step included, up to the largest counter."""
    ids = RequestIds()
    ids._prefix = b"0123456789abcdef"
    for n in (0, 1, 15, 16, 0xDEADBEEF, 2**32 - 1, 2**63 + 5, 2**64 - 1):
        ids._n = n
        assert ids.new() == b"0123456789abcdef" + b"%016x" % n
        assert ids._n == n + 1 or n == 2**64 - 1
    ids._prefix = b""
    ids._n = 0xABC
    assert ids.new() == b"0000000000000abc"
