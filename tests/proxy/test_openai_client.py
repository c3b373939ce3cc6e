"""The official openai client, sync and async, through the proxy to the stub engine."""

from __future__ import annotations

import json

import openai
import pytest

from tests.proxy.conftest import Stack, fast_settings, model


def client(stack: Stack, **kw: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url, api_key="k", max_retries=0, **kw)  # type: ignore[arg-type]


def test_chat_rewrites_model_and_echoes_request_id(proxy: Stack) -> None:
    c = client(proxy)
    r = c.chat.completions.with_raw_response.create(
        model="m1", messages=[{"role": "user", "content": "hi"}])
    out = r.parse()
    assert out.choices[0].message.content == "hello from stub"
    # the backend saw its served name, and our request id, which the client exposes
    seen = proxy.stub.requests[-1]
    assert json.loads(seen.body)["model"] == "served-m1"
    assert out.model == "served-m1"
    assert out._request_id == seen.headers["x-request-id"]
    assert len(out._request_id) == 32
    assert r.headers["x-flexinfer-route"].startswith("default;single;127.0.0.1:")


def test_alias_and_client_request_id_kept(proxy: Stack) -> None:
    c = client(proxy)
    out = c.chat.completions.create(model="alias1", messages=[{"role": "user", "content": "x"}],
                                    extra_headers={"X-Request-ID": "my-req-1"})
    assert out._request_id == "my-req-1"
    assert proxy.stub.requests[-1].headers["x-request-id"] == "my-req-1"
    assert json.loads(proxy.stub.requests[-1].body)["model"] == "served-m1"


def test_completions_embeddings_models(proxy: Stack) -> None:
    c = client(proxy)
    assert c.completions.create(model="m2", prompt="x").choices[0].text == "hello from stub"
    emb = c.embeddings.create(model="m2", input="x")
    assert emb.data[0].embedding == [0.1, 0.2, 0.3]
    ids = [m.id for m in c.models.list()]
    assert ids == ["m1", "m2"]
    assert c.models.retrieve("m1").id == "m1"
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("nope")


def test_streaming_chunk_by_chunk(proxy: Stack) -> None:
    c = client(proxy)
    stream = c.chat.completions.create(model="m1", messages=[{"role": "user", "content": "x"}], stream=True,
                                       extra_headers={"x-stub-chunks": "5"})
    deltas = [ch.choices[0].delta.content for ch in stream if ch.choices]
    assert deltas == ["", "tok0 ", "tok1 ", "tok2 ", "tok3 ", "tok4 ", None]


def test_error_classes(stack: Stack) -> None:
    stack.start_proxy([model("m1", stack.stub), model("dead", 1)],
                      fast_settings(auth_enabled=True, auth_tokens=("secret",)))
    good = openai.OpenAI(base_url=stack.base_url, api_key="secret", max_retries=0)
    bad = openai.OpenAI(base_url=stack.base_url, api_key="wrong", max_retries=0)
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(openai.AuthenticationError) as ei:
        bad.chat.completions.create(model="m1", messages=msgs)  # type: ignore[arg-type]
    assert ei.value.code == "invalid_api_key"
    assert ei.value.response.headers["www-authenticate"].startswith("Bearer")
    with pytest.raises(openai.NotFoundError) as ei2:
        good.chat.completions.create(model="nope", messages=msgs)  # type: ignore[arg-type]
    assert ei2.value.code == "model_not_found"
    assert ei2.value.response.headers["x-should-retry"] == "false"
    with pytest.raises(openai.BadRequestError) as ei3:
        good.chat.completions.create(model="bad name\r\nX-Evil: 1", messages=msgs)  # type: ignore[arg-type]
    assert ei3.value.code == "invalid_model_name"
    with pytest.raises(openai.RateLimitError):  # the backend's 429 passes through unchanged
        good.chat.completions.create(model="m1", messages=msgs,  # type: ignore[arg-type]
                                     extra_headers={"x-stub-mode": "status:429"})
    with pytest.raises(openai.InternalServerError) as ei4:  # nobody listens on port 1
        good.chat.completions.create(model="dead", messages=msgs)  # type: ignore[arg-type]
    assert ei4.value.status_code == 503
    assert ei4.value.code == "upstream_unavailable"
    assert ei4.value.request_id  # request id on errors too
    # nothing refused above reached the backend except the 429 pass-through
    assert len(stack.stub.requests) == 1


async def test_async_client_chat_and_stream(proxy: Stack) -> None:
    c = openai.AsyncOpenAI(base_url=proxy.base_url, api_key="k", max_retries=0)
    out = await c.chat.completions.create(model="m1", messages=[{"role": "user", "content": "x"}])
    assert out.choices[0].message.content == "hello from stub"
    stream = await c.chat.completions.create(model="m2", messages=[{"role": "user", "content": "x"}],
                                             stream=True, extra_headers={"x-stub-chunks": "3"})
    got = [ch.choices[0].delta.content async for ch in stream if ch.choices]
    assert got == ["", "tok0 ", "tok1 ", "tok2 ", None]
    with pytest.raises(openai.NotFoundError):
        await c.chat.completions.create(model="zzz", messages=[{"role": "user", "content": "x"}])
    await c.close()


def test_mid_stream_failure_raises_api_error(proxy: Stack) -> None:
    c = client(proxy)
    stream = c.chat.completions.create(model="m1", messages=[{"role": "user", "content": "x"}], stream=True,
                                       extra_headers={"x-stub-fail-after": "3", "x-stub-chunks": "10"})
    got = []
    with pytest.raises(openai.APIError) as ei:
        for ch in stream:
            got.append(ch.choices[0].delta.content)
    assert got == ["", "tok0 ", "tok1 "]  # the events before the failure are kept
    assert "mid-stream" in str(ei.value)


def test_max_tokens_clamped_to_context_window(stack: Stack) -> None:
    stack.start_proxy([model("m", stack.stub, context_window=2048, served_name="srv")], fast_settings())
    c = client(stack)
    r = c.chat.completions.with_raw_response.create(model="m", messages=[{"role": "user", "content": "x"}],
                                                    max_tokens=4000)
    assert r.headers["x-flexinfer-maxtokens-clamped"] == "4000->1536"
    sent = json.loads(stack.stub.requests[-1].body)
    assert sent["max_tokens"] == 1536 and sent["model"] == "srv"
    r = c.chat.completions.with_raw_response.create(model="m", messages=[{"role": "user", "content": "x"}],
                                                    max_tokens=100)
    assert "x-flexinfer-maxtokens-clamped" not in r.headers
    assert json.loads(stack.stub.requests[-1].body)["max_tokens"] == 100
