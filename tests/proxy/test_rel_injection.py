"""F17 (reliability plan H1/N1/P1): header injection, model names as hosts, path traversal.

Every variant of the plan's H1, N1 and P1 rows (those of tests/proxy/test_hostile.py and the rest:
``..\\``, ``;x=y``, ``%00``, full-width dots, 300 characters, a homoglyph, ``other.ns``) is sent to
the real proxy while the process's resolver (``socket.getaddrinfo``, which asyncio's own lookups
go through) records every name asked for. Pass: 0 injected headers upstream (no ``X-Evil`` in any
request the engine captured), 0 lookups of any name but the registry's 127.0.0.1 (which only the
test client's own connects resolve), 0 upstream paths containing ``..``, and no 5xx answer. Which 4xx each case gets is
tests/proxy/test_hostile.py's subject.
"""

from __future__ import annotations

import socket
from collections import Counter
from typing import Any

import pytest

from tests.proxy._rel import figure
from tests.proxy.test_hostile import CASES, exchange, post

CHAT = "/v1/chat/completions"


def body(model: str) -> bytes:
    return ('{"model":"%s","messages":[{"role":"user","content":"x"}]}' % model).encode()  # noqa: UP031


EXTRA = [
    ("H1 header CRLF via obs-fold", post(CHAT, "X-Model-ID: m1\r\n X-Evil: 1\r\n")),
    ("H1 encoded CRLF in header", post(CHAT, "X-Model-ID: m%0d%0aX-Evil:%201\r\n")),
    ("H1 path LF", post("/model/m1%0aX-Evil:%201/v1/chat/completions")),
    ("H1 body LF", post(CHAT, body=b'{"model":"m1\\nX-Evil: 1"}')),
    ("H1 body unicode LS", post(CHAT, body=b'{"model":"m1\\u2028X-Evil: 1"}')),
    ("P1 backslash dots", post("/model/..\\admin/v1/chat/completions")),
    ("P1 encoded backslash dots", post("/model/..%5cadmin/v1/chat/completions")),
    ("P1 matrix param", post("/model/m1;x=y/v1/chat/completions")),
    ("P1 NUL", post("/model/m1%00/v1/chat/completions")),
    ("P1 full-width dots", post("/model/\uff0e\uff0e/v1/chat/completions".encode().decode("latin-1"))),
    ("P1 encoded full-width dots", post("/model/%ef%bc%8e%ef%bc%8e/v1/chat/completions")),
    ("P1 dots after v1", post("/model/m1/v1/../../admin")),
    ("P1 encoded dots after v1", post("/v1/%2e%2e/%2e%2e/admin")),
    ("P1 dot segment", post("/v1/./chat/completions")),
    ("N1 other.ns", post(CHAT, body=body("other.ns"))),
    ("N1 300 characters", post(CHAT, body=body("m" * 300))),
    ("N1 homoglyph", post(CHAT, body=body("m\u04301"))),  # Cyrillic a
    ("N1 header host name", post(CHAT, "X-Model-ID: kubernetes.default.svc\r\n")),
    ("N1 path host:port", post("/model/127.0.0.1:6443/v1/chat/completions")),
    ("N1 path userinfo", post("/model/a@evil:80/v1/chat/completions")),
    ("N2 api_base", post(CHAT, body=b'{"model":"m1","api_base":"http://evil.example:80","messages":[]}')),
    ("N2 base_url", post(CHAT, body=b'{"model":"m1","base_url":"http://169.254.169.254/","messages":[]}')),
    ("P2 Host evil", b"POST /v1/chat/completions HTTP/1.1\r\nHost: evil.example\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body("m1")), body("m1"))),
    ("P2 absolute-form", b"POST http://evil.example/v1/chat/completions HTTP/1.1\r\nHost: a\r\n"
                         b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body("m1")), body("m1"))),
]
VARIANTS = [(name, data) for name, data, _ in CASES if name.split()[0] in ("H1", "N1", "P1", "M25", "M28")] + EXTRA


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    seen: list[Any] = []
    real = socket.getaddrinfo

    def recording(host: Any, *args: Any, **kw: Any) -> Any:
        seen.append(host)
        return real(host, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", recording)
    return seen


def test_injection_variants(proxy: Any, lookups: list[Any]) -> None:
    statuses: Counter[int] = Counter()
    fivexx = []
    served: list[str] = []
    for name, data in VARIANTS:
        raw = data.encode("latin-1") if isinstance(data, str) else data
        raw = raw.replace(b"\r\nHost: ", b"\r\nConnection: close\r\nHost: ", 1)  # no keep-alive wait
        status, buf, _ = exchange(proxy.port, raw)
        statuses[status] += 1
        if status == 200:
            served.append(name)
        if status >= 500 or status == 0:
            fivexx.append((name, buf[:200]))
    captured = proxy.stub.requests
    injected = [c for c in captured if any(k.lower().startswith(b"x-evil") for k, _ in c.raw_headers)
                or b"x-evil" in c.body.lower()]
    dotdot = [c.path for c in captured if ".." in c.path or "%2e%2e" in c.path.lower()]
    user_lookups = [h for h in lookups if h not in ("127.0.0.1", b"127.0.0.1")]  # the test client's own dials
    figure("F17", variants=len(VARIANTS), statuses=dict(statuses), served=served, forwarded=len(captured),
           injected_headers=len(injected), lookups_total=len(lookups), user_derived_lookups=len(user_lookups),
           dotdot_paths=len(dotdot), errors_5xx=len(fivexx))
    assert fivexx == []
    assert injected == [] and dotdot == []
    assert user_lookups == []
    assert all(c.path.startswith("/v1/") for c in captured), [c.path for c in captured]
