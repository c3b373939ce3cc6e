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


def test_the_memos_answer_as_the_checks_do_remember_only_what_passed_and_stay_bounded() -> None:
    """The name and path checks are memoized (plain dicts, both twins): a repeated value gets the same
    answer, a refused one is refused again every time and never remembered, and a flood of distinct
    values never holds more than the bound."""
    for _ in range(3):
        assert extract.check_model_name("memo-model", "t") == "memo-model"
        assert extract.normalize_path("//v1//memo") == "/v1/memo"
        assert extract.route_path("/model/memo-m/v1/x") == ("memo-m", "/v1/x")
        with pytest.raises(errors.InvalidModelName):
            extract.check_model_name("bad name", "t")
        with pytest.raises(errors.BadRequest):
            extract.normalize_path("/v1/../memo")
        with pytest.raises(errors.NotFound):
            extract.route_path("/memo")
    assert "bad name" not in extract._names_ok and "/v1/../memo" not in extract._paths
    assert "/memo" not in extract._routes
    bound = extract._MEMO_MAX
    for i in range(bound * 3 + 7):
        assert extract.check_model_name(f"m{i}", "t") == f"m{i}"
        assert extract.normalize_path(f"/v1//p{i}") == f"/v1/p{i}"
        assert extract.route_path(f"/model/m{i}/v1/x") == (f"m{i}", "/v1/x")
        assert max(len(extract._names_ok), len(extract._paths), len(extract._routes)) <= bound
    assert extract.route_path("/model/memo-m/v1/x") == ("memo-m", "/v1/x")  # dropped, then checked again


# ---- the path policy: normalize_path + route_path, decided in one place ------------------------

@pytest.mark.parametrize(("path", "name", "rest"), [
    ("/model/m1/v1/chat/completions", "m1", "/v1/chat/completions"),
    ("/v1/chat/completions", None, "/v1/chat/completions"),
    ("//model/m1/v1/chat/completions", "m1", "/v1/chat/completions"),
    ("/model//m1//v1///chat/completions", "m1", "/v1/chat/completions"),
    ("//v1/chat/completions", None, "/v1/chat/completions"),
    ("/v1//embeddings", None, "/v1/embeddings"),
    ("/model/m1/v1/", "m1", "/v1/"),
    ("/v1/a%41b", None, "/v1/a%41b"),  # other escapes are the backend's business, forwarded as sent
])
def test_route_path(path: str, name: str | None, rest: str) -> None:
    assert extract.route_path(extract.normalize_path(path)) == (name, rest)


@pytest.mark.parametrize("path", ["/model/m1", "/model/m1/", "/model/m1/health", "/model/m1/v2/chat",
                                  "/", "/health", "/props", "/slots", "/v1", "/model/m1/v1", "/admin/v1/x",
                                  "//model/m1", "/model//v1", "//model//v1/x"])
def test_paths_outside_v1_are_never_forwarded(path: str) -> None:
    with pytest.raises(errors.NotFound) as ei:
        extract.route_path(extract.normalize_path(path))
    assert ei.value.error_code == "unknown_url"


@pytest.mark.parametrize("path", ["/model/../admin/v1", "/model/%2e%2e/v1", "/model/foo%2fbar/v1",
                                  "/model/a b/v1", "/model/", "/model"])
def test_bad_model_paths(path: str) -> None:
    with pytest.raises(errors.BadRequest):
        extract.route_path(extract.normalize_path(path))


@pytest.mark.parametrize("path", ["/v1/../admin", "/v1/%2e%2e/admin", "/v1/a%2fb", "/v1/x%00", "/v1\\..\\x",
                                  "/v1/%252e%252e/x", "/v1/./x", "/v1//../x", "/v1/.%2E/x", "/v1/%2E/x",
                                  "/v1/x/..", "/v1/a%5Cb", "/v1/%2F", "/v1/%c0%ae%c0%ae/x", "/v1/%C1%9C"])
def test_bad_upstream_paths(path: str) -> None:
    with pytest.raises(errors.BadRequest) as ei:
        extract.normalize_path(path)
    assert ei.value.error_code == "invalid_path"


@given(st.text(alphabet="/.%2eEfF5cC0a", max_size=24))
@settings(max_examples=500, deadline=None)
def test_a_routed_path_is_canonical(path: str) -> None:
    """Whatever the input, a path that is routed is under /v1/ with no empty or dot segment."""
    try:
        _, rest = extract.route_path(extract.normalize_path("/" + path))
    except errors.FlexInferError:
        return
    assert rest.startswith("/v1/") and "//" not in rest
    segments = rest.split("/")[1:]
    assert not any(seg.lower() in (".", "..", "%2e", "%2e%2e", ".%2e", "%2e.") for seg in segments)


# ---- a second "model" key, whatever its spelling ------------------------------------------------

ESCAPED_MODEL_KEYS = [b'"\\u006dodel"', b'"\\u006Dodel"', b'"m\\u006fdel"', b'"mo\\u0064el"', b'"mod\\u0065l"',
                      b'"mode\\u006c"', b'"mode\\u006C"', b'"\\u006d\\u006f\\u0064\\u0065\\u006c"']


@pytest.mark.parametrize("key", ESCAPED_MODEL_KEYS)
@pytest.mark.parametrize("order", ["escaped-last", "escaped-first"])
def test_escaped_duplicate_model_key_is_400(key: bytes, order: str) -> None:
    pairs = [b'"model":"m1"', key + b':"m2"']
    if order == "escaped-first":
        pairs.reverse()
    body = b'{"messages":[],' + b",".join(pairs) + b"}"
    assert json.loads(body, object_pairs_hook=lambda p: p).count(("model", "m1")) == 1  # a real duplicate
    with pytest.raises(errors.InvalidJSON):
        extract.parse_json_counted(body)


@pytest.mark.parametrize("key", ESCAPED_MODEL_KEYS)
def test_a_single_escaped_model_key_is_the_model(key: bytes) -> None:
    data, _ = extract.parse_json_counted(b'{"messages":[],' + key + b':"m2"}')
    assert extract.body_model(data) == "m2"


def test_escaped_model_inside_a_nested_object_is_not_a_duplicate() -> None:
    data, _ = extract.parse_json_counted(b'{"metadata":{"\\u006dodel":"x","model":"y"},"model":"m"}')
    assert extract.body_model(data) == "m"


_KEY_TEXT = st.sampled_from(["model", "mode", "models", "Model", "messages", "x", "\\u006dodel", "m\\u006fdel",
                             "\\u006d\\u006f\\u0064\\u0065\\u006c", "mod\\u0065l", "\\u0041", "\\u00e9"])


@given(st.lists(st.tuples(_KEY_TEXT, st.sampled_from(['"m1"', '"m2"', "1", "{}", '{"model":"z"}', '"\\"model\\""'])),
                max_size=5))
@settings(max_examples=400, deadline=None)
def test_duplicate_decision_agrees_with_a_real_json_parser(pairs: list[tuple[str, str]]) -> None:
    body = ("{" + ",".join(f'"{k}":{v}' for k, v in pairs) + "}").encode()
    real = sum(1 for k, _ in json.loads(body, object_pairs_hook=lambda p: p) if k == "model")
    if real > 1:
        with pytest.raises(errors.InvalidJSON):
            extract.parse_json_counted(body)
    else:
        data, _ = extract.parse_json_counted(body)
        assert data is not None and ("model" in data) == (real == 1)


# ---- multipart: one model field at most, read as form parsers read it --------------------------

def _multipart(*parts: tuple[bytes, bytes], boundary: bytes = b"XyZ") -> tuple[bytes, bytes]:
    body = b"".join(b"--" + boundary + b"\r\n" + head + b"\r\n\r\n" + value + b"\r\n" for head, value in parts)
    return body + b"--" + boundary + b"--\r\n", b"multipart/form-data; boundary=" + boundary


FILE = (b'Content-Disposition: form-data; name="file"; filename="a.wav"\r\nContent-Type: audio/wav', b"RIFF")


@pytest.mark.parametrize("second", [
    b'Content-Disposition: form-data; name="model"',
    b"Content-Disposition: form-data; name=model",
    b'content-disposition: FORM-DATA; NAME="model"',
    b'Content-Disposition: form-data; name = "model"',
    b'Content-Disposition: form-data; filename="x.txt"; name="model"',
    b"Content-Disposition: form-data; name*=utf-8''model",
    b"Content-Disposition: form-data; name*=UTF-8''%6Dodel",
    b'Content-Disposition: form-data; name="mod\\el"',
])
def test_two_multipart_model_fields_are_400(second: bytes) -> None:
    body, ctype = _multipart((b'Content-Disposition: form-data; name="model"', b"m1"), FILE, (second, b"m2"))
    with pytest.raises(errors.BadRequest) as ei:
        extract.multipart_model(body, ctype)
    assert ei.value.error_code == "duplicate_model"


def test_two_identical_multipart_model_fields_are_400_too() -> None:
    body, ctype = _multipart((b'Content-Disposition: form-data; name="model"', b"m1"),
                             (b'Content-Disposition: form-data; name="model"', b"m1"))
    with pytest.raises(errors.BadRequest):
        extract.multipart_model(body, ctype)


@pytest.mark.parametrize(("head", "expected"), [
    (b'Content-Disposition: form-data; name="model"', "m1"),
    (b"Content-Disposition: form-data; name=model", "m1"),
    (b'Content-Disposition: form-data; name="file"; filename="model"', None),
    (b'Content-Disposition: form-data; name="model_name"', None),
    (b'Content-Disposition: form-data; name="Model"', None),
    (b'Content-Type: text/plain\r\nContent-Disposition: form-data; name="model"', "m1"),
])
def test_multipart_model_field_is_read_as_form_parsers_read_it(head: bytes, expected: str | None) -> None:
    body, ctype = _multipart(FILE, (head, b"m1"))
    assert extract.multipart_model(body, ctype) == expected


@pytest.mark.parametrize("head", [
    b'Content-Disposition: form-data; name="model"\r\nContent-Disposition: form-data; name="x"',
    b'Content-Disposition: form-data; name="x"; name="model"',
])
def test_ambiguous_multipart_part_is_400(head: bytes) -> None:
    body, ctype = _multipart((head, b"m1"))
    with pytest.raises(errors.BadRequest):
        extract.multipart_model(body, ctype)


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


def test_rewrite_splices_past_non_ascii_escapes() -> None:
    # only an escaped spelling of the key itself (\u006...) forces a re-encoding, not \u00e9 in a prompt
    body = b'{"messages": [{"role": "user", "content": "caf\\u00e9  \\n"}], "model": "m1"}'
    data = extract.parse_json(body)
    assert data is not None
    assert extract.rewrite_model(body, data, "served/m1") == body.replace(b'"m1"', b'"served/m1"')


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
    data, scan = extract.parse_json_counted(body)
    assert data == orjson.loads(body) and scan[:2] == (body.count(b'"model"'), body.find(b'"model"'))
    out_bytes = extract.rewrite_model(body, data, new, scan)
    assert out_bytes == extract.rewrite_model(body, data, new)  # the handed-over scan changes nothing
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
