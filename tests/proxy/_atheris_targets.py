"""Row F3 of the reliability plan: atheris (coverage-guided, libFuzzer) targets on the proxy's
Python layers that read client bytes. Run one target in its own process (atheris exits the
interpreter):

    FLEXINFER_NO_EXTENSIONS=1 python -m tests.proxy._atheris_targets TARGET SECONDS [libFuzzer flags]

Owns: the five targets and their oracles. ``model`` (JSON body -> model name: parse_json_counted +
body_model + is_stream), ``rewrite`` (the upstream body rewrite: the result parses to the same
object with ``model`` replaced, nothing else changed), ``multipart`` (the form-field scan under a
fuzzed boundary), ``routing`` (path policy + model grammar + affinity/prefix keys) and ``chunked``
(a backend's chunked body, read by ``_speedups.ChunkedBody`` in fuzzed reads, against httptools
reading it whole: see :func:`t_chunked`). A client
error (a :class:`FlexInferError` with a 4xx status) is an allowed outcome; any other exception,
a 5xx error or a broken invariant is a crash (atheris prints the input and exits non-zero).
Must not: import a compiled module (atheris instruments Python bytecode only: the runner sets
FLEXINFER_NO_EXTENSIONS=1 before flexinfer is imported) or do I/O beyond stdout/stderr.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

os.environ.setdefault("FLEXINFER_NO_EXTENSIONS", "1")

import atheris

import flexinfer  # noqa: F401  (first: its import hook must sit behind atheris's in sys.meta_path)

with atheris.instrument_imports(include=["flexinfer"]):
    from flexinfer._speedups import bodyframe_py
    from flexinfer.errors import FlexInferError
    from flexinfer.proxy import extract, routing

import httptools

from tests.speedups.conftest import (  # after the instrumented imports: it imports flexinfer._speedups
    BodySink,
    chunked_reads,
    split_reads,
)

_SEEDS = (b'{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}',
          b'{"\\u006dodel":"a","model":"b"}', b"[" * 50, b'{"model":1e999}',
          b'{"model":"llama-3.1:8b","session_id":"s","prefix":"p","cache_key":"abc"}',
          b'{"model":"a","messages":[{"role":"system","content":[{"type":"text","text":"sys"}]}]}',
          b'\x20/model/m/v1/chat/completions\x00\x00{"model":"m"}',
          b"\x08\x01b0undary--b0undary\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n"
          b"m\r\n--b0undary\r\nContent-Disposition: form-data; name*=UTF-8''model\r\n\r\nx\r\n--b0undary--",
          b"\x02\x05\x11a\r\ndata: {\"x\":1}\n\n\r\n5;e=1\r\nhello\r\n0\r\nX-T: 1\r\n\r\n")


def _client_error(exc: FlexInferError) -> None:
    if not 400 <= exc.status < 500:
        raise AssertionError(f"{type(exc).__name__} is a {exc.status}, not a client error") from exc


def t_model(data: bytes) -> None:
    try:
        parsed = extract.parse_json(data)
        extract.body_model(parsed)
        extract.is_stream(parsed)
    except FlexInferError as exc:
        _client_error(exc)


def t_rewrite(data: bytes) -> None:
    try:
        parsed, scan = extract.parse_json_counted(data)
    except FlexInferError as exc:
        _client_error(exc)
        return
    if parsed is None:
        return
    import orjson

    out = extract.rewrite_model(data, parsed, "routed-m", scan)
    again = orjson.loads(out)
    want = dict(parsed)
    want["model"] = "routed-m"
    if again != want and not _has_nan(want):
        raise AssertionError(f"rewrite changed the body: {again!r} != {want!r}")


def _has_nan(v: Any) -> bool:  # NaN != NaN: such bodies cannot be compared by equality
    if isinstance(v, float):
        return v != v
    if isinstance(v, dict):
        return any(_has_nan(x) for x in v.values())
    if isinstance(v, list):
        return any(_has_nan(x) for x in v)
    return False


def t_multipart(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    boundary = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 80))
    quoted = fdp.ConsumeBool()
    body = fdp.ConsumeBytes(fdp.remaining_bytes())
    ctype = b"multipart/form-data; boundary=" + (b'"' + boundary + b'"' if quoted else boundary)
    try:
        name = extract.multipart_model(body, ctype)
    except FlexInferError as exc:
        _client_error(exc)
        return
    if name is not None and extract.check_model_name(name, "x") != name:
        raise AssertionError("a multipart model name passed the grammar but changed")


class _Headers(dict[bytes, bytes]):
    def get(self, name: bytes, default: bytes | None = None) -> bytes | None:  # type: ignore[override]
        return super().get(name, default)


def t_routing(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    path = fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 300))
    hdrs = _Headers({b"x-session-id": fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40)),
                     b"x-flexinfer-cache-key": fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40))})
    body = fdp.ConsumeBytes(fdp.remaining_bytes())
    try:  # as the pipeline does: the path is normalized (merged slashes, dot segments refused) first
        name, upstream = extract.route_path(extract.normalize_path(path))
        if not upstream.startswith("/v1/") or "/../" in upstream or "//" in upstream:
            raise AssertionError(f"route_path({path!r}) let {upstream!r} through")
        if name is not None:
            extract.check_model_name(name, "the path")
        parsed = extract.parse_json(body)
    except FlexInferError as exc:
        _client_error(exc)
        return
    for key in (routing.session_key, routing.prefix_key):
        k, _source = key(parsed, hdrs)
        if k is not None and not isinstance(k, str):
            raise AssertionError(f"{key.__name__} gave a {type(k).__name__}")
    routing.prompt_text(parsed)


_CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"


def t_chunked(data: bytes) -> None:
    """However the body is cut into reads, the decoder fails, waits or ends it as it does with the
    body in one read, with the same payload unless it fails (a failing read's payload is dropped, so
    earlier reads may have delivered more) and no more bytes after the end; and, cut or whole:
    where httptools (llhttp) reads the body without error, the decoder ends it where httptools does
    with the same payload, or waits with the same payload; where both fail, one payload is the
    start of the other."""
    fdp = atheris.FuzzedDataProvider(data)
    # the cuts before the body: a provider out of bytes answers every ConsumeIntInRange with its minimum
    cuts = [fdp.ConsumeIntInRange(0, 4096) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    body = fdp.ConsumeBytes(fdp.remaining_bytes())
    whole = chunked_reads(bodyframe_py, [body], 1 << 20)
    split = chunked_reads(bodyframe_py, split_reads(body, cuts), 1 << 20)
    if (split[0], split[2]) != (whole[0], whole[2]) or split[3] > whole[3] or (
            whole[0] == "ok" and split[1] != whole[1]):
        raise AssertionError(f"cut at {cuts}: {split!r}, whole {whole!r}")
    sink = BodySink()
    try:
        httptools.HttpResponseParser(sink).feed_data(_CHUNKED_HEAD + body)
        ht_failed = False
    except httptools.HttpParserError:
        ht_failed = True
    ht_payload = b"".join(sink.body)
    for verdict, payload, ended, _extra in (whole, split):
        failed = verdict == "error"
        if not ht_failed or sink.done:  # httptools read it (or ended it before failing on the bytes after)
            if failed or ended != sink.done or payload != ht_payload:
                raise AssertionError(f"decoder {whole!r} / cut {split!r}, httptools ok={not ht_failed} "
                                     f"ended={sink.done} {ht_payload!r}")
        elif failed and not (payload.startswith(ht_payload) or ht_payload.startswith(payload)):
            raise AssertionError(f"both failed, payloads {payload!r} / {ht_payload!r}")


def t_all(data: bytes) -> None:  # the CI run: the five targets in one process, picked by the first byte
    if data:
        _EACH[data[0] % len(_EACH)](data[1:])


def t_broken(data: bytes) -> None:  # the harness's self-test: a target that breaks must be reported
    if len(data) > 3:
        raise AssertionError("broken target")


_EACH = (t_model, t_rewrite, t_multipart, t_routing, t_chunked)
TARGETS: dict[str, Callable[[bytes], None]] = {"model": t_model, "rewrite": t_rewrite, "multipart": t_multipart,
                                               "routing": t_routing, "chunked": t_chunked, "all": t_all,
                                               "broken": t_broken}


def main() -> None:
    target, seconds, *flags = sys.argv[1:]
    fn = TARGETS[target]
    seeds = [bytes([k]) + s for s in _SEEDS for k in range(len(_EACH))] if target == "all" else list(_SEEDS)
    if target != "broken":
        for s in seeds:  # the seeds run once outside libFuzzer: a broken oracle fails fast
            fn(s)
    argv = [sys.argv[0], f"-max_total_time={int(float(seconds))}", "-rss_limit_mb=1024",
            "-max_len=4096", "-print_final_stats=1",
            f"-artifact_prefix={tempfile.gettempdir()}/atheris-crash-", *flags]
    corpus = tempfile.mkdtemp(prefix=f"atheris-{target}-")
    for i, seed in enumerate(seeds):
        with open(os.path.join(corpus, f"seed{i}"), "wb") as f:
            f.write(seed)
    atheris.Setup([*argv, corpus], fn)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
