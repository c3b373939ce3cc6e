"""Backend connection reuse through the real proxy: a finished stream's connection goes back to the
pool and serves the next request; N concurrent streams, then N more, open at most N backend
connections (the stub engine counts the connections it accepted)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.proxy.conftest import Stack, fast_settings, model

N = 6


@pytest.fixture
def clients(stack: Stack) -> Iterator[list[openai.OpenAI]]:
    stack.start_proxy([model("m", stack.stub)], fast_settings())
    made = [openai.OpenAI(base_url=stack.base_url, api_key="k", max_retries=0) for _ in range(N)]
    yield made
    for c in made:
        c.close()


def _stream(c: openai.OpenAI) -> str:
    out = []
    for chunk in c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                           stream=True, extra_headers={"x-stub-chunks": "8"}):
        if chunk.choices and chunk.choices[0].delta.content:
            out.append(chunk.choices[0].delta.content)
    return "".join(out)


def _opened(stack: Stack) -> int:
    return stack.call(lambda: stack.stub.connections_total)  # type: ignore[no-any-return]


def test_a_finished_stream_connection_serves_the_next_requests(stack: Stack, clients: list[openai.OpenAI]) -> None:
    c = clients[0]
    assert _stream(c)
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert _stream(c)
    assert _opened(stack) == 1


def test_concurrent_streams_then_more_open_at_most_one_connection_each(
        stack: Stack, clients: list[openai.OpenAI]) -> None:
    with ThreadPoolExecutor(N) as ex:
        for _ in range(3):  # N at once, three times over: the second and third rounds reuse the pool
            texts = list(ex.map(_stream, clients))
            assert all(texts)
    assert _opened(stack) <= N
