"""Model extraction and the body rewrite, as pure functions."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexinfer import errors
from flexinfer.proxy import extract


@pytest.mark.parametrize("name", ["llama3", "gpt-4o-mini", "Qwen/Qwen2.5-7B", "llama3:8b", "a", "m.v1_2@x"])
def test_valid_names(name: str) -> None:
    assert extract.check_model_name(name, "t") == name


@pytest.mark.parametrize("name", ["", "bad name", "m\r\nX-Evil: 1", "ll\xffama", "a" * 300, "-x", "x-",
                                  "../etc", "a..b", "kubernetes default", "evil.com/#", "a%2fb", "llama "])
def test_invalid_names(name: str) -> None:
    with pytest.raises(errors.InvalidModelName):
        extract.check_model_name(name, "t")


@pytest.mark.parametrize(("path", "name", "rest"), [
    ("/model/m1/v1/chat/completions", "m1", "/v1/chat/completions"),
    ("/model/m1", "m1", "/"),
    ("/v1/chat/completions", None, "/v1/chat/completions"),
])
def test_split_model_path(path: str, name: str | None, rest: str) -> None:
    assert extract.split_model_path(path) == (name, rest)


@pytest.mark.parametrize("path", ["/model/../admin/v1", "/model/%2e%2e/v1", "/model/foo%2fbar/v1", "/model//v1",
                                  "/model/a b/v1"])
def test_bad_model_paths(path: str) -> None:
    with pytest.raises(errors.BadRequest):
        extract.check_path(extract.split_model_path(path)[1])


@pytest.mark.parametrize("path", ["/v1/../admin", "/v1/%2e%2e/admin", "/v1/a%2fb", "/v1/x%00", "/v1\\..\\x",
                                  "/v1/%252e%252e/x", "/v1/./x"])
def test_bad_upstream_paths(path: str) -> None:
    with pytest.raises(errors.BadRequest):
        extract.check_path(path)


@pytest.mark.parametrize("body", [b"[1]", b"{", b'{"a": NaN}', b"[" * 100_000, b'{"a":' + b"9" * 5000 + b"}",
                                  b'{"model":"a","model":"b"}', b'"x"'])
def test_bad_json_is_400(body: bytes) -> None:
    with pytest.raises(errors.BadRequest):
        extract.parse_json(body)


def test_model_in_content_is_not_a_duplicate() -> None:
    body = b'{"messages":[{"role":"user","content":"\\"model\\" \\"model\\""}],"model":"m"}'
    data = extract.parse_json(body)
    assert data is not None and extract.body_model(data) == "m"
    nested = b'{"model":"m","tools":[{"model":"x"}]}'
    assert extract.parse_json(nested) is not None


def test_rewrite_splices_without_reencoding() -> None:
    body = b'{"messages": [{"role": "user", "content": "hi  there"}], "model": "m1", "stream": true}'
    data = extract.parse_json(body)
    assert data is not None
    out = extract.rewrite_model(body, data, "served/m1")
    assert out == body.replace(b'"m1"', b'"served/m1"')  # spacing of the rest kept byte for byte


def test_rewrite_falls_back_when_ambiguous() -> None:
    body = b'{"model":"m1","tools":[{"model":"m1"}]}'
    data = extract.parse_json(body)
    assert data is not None
    out = json.loads(extract.rewrite_model(body, data, "new"))
    assert out == {"model": "new", "tools": [{"model": "m1"}]}


json_values = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=20),
                           lambda ch: st.lists(ch, max_size=3) | st.dictionaries(st.text(max_size=8), ch, max_size=3),
                           max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(extra=st.dictionaries(st.text(max_size=8).filter(lambda k: k != "model"), json_values, max_size=5),
       old=st.text(min_size=1, max_size=20), new=st.text(min_size=1, max_size=20), indent=st.booleans())
def test_rewrite_property(extra: dict, old: str, new: str, indent: bool) -> None:
    obj = {**extra, "model": old}
    body = json.dumps(obj, indent=2 if indent else None, ensure_ascii=indent).encode()
    data, keys = extract.parse_json_counted(body)
    assert data == orjson.loads(body) and keys == body.count(b'"model"')
    out_bytes = extract.rewrite_model(body, data, new, keys)
    assert out_bytes == extract.rewrite_model(body, data, new)  # the handed-over count changes nothing
    assert orjson.loads(out_bytes) == {**extra, "model": new}


def mp(fields: list[tuple[str, bytes]], boundary: bytes = b"XyZ") -> tuple[bytes, bytes]:
    parts = b""
    for name, value in fields:
        parts += (b"--" + boundary + b"\r\nContent-Disposition: form-data; name=\"" + name.encode()
                  + b"\"\r\n\r\n" + value + b"\r\n")
    return parts + b"--" + boundary + b"--\r\n", b"multipart/form-data; boundary=" + boundary


def test_multipart_model() -> None:
    body, ct = mp([("file", b"\x00\x01binary"), ("model", b"whisper-1")])
    assert extract.multipart_model(body, ct) == "whisper-1"
    body, ct = mp([("file", b"x")])
    assert extract.multipart_model(body, ct) is None


def test_multipart_hostile() -> None:
    body, _ = mp([("model", b"m")])
    with pytest.raises(errors.BadRequest):
        extract.multipart_model(body, b"multipart/form-data; boundary=" + b"b" * 71)
    with pytest.raises(errors.BadRequest):
        extract.multipart_model(body, b"multipart/form-data")
    many, ct = mp([("f", b"x")] * 1500 + [("model", b"m")])
    with pytest.raises(errors.PayloadTooLarge):
        extract.multipart_model(many, ct)
    big, ct = mp([("model", b"m" * (1 << 20))])
    with pytest.raises(errors.InvalidModelName):
        extract.multipart_model(big, ct)
    with pytest.raises(errors.BadRequest):
        extract.multipart_model(b"\r\n" * 100000, ct)
