"""Routing through the running proxy with several stub engines, and the router's pure behaviour."""

from __future__ import annotations

import collections
import concurrent.futures
import json
import random

import openai

from flexinfer.proxy.routing import PrefixStore, Router, prefix_key, session_key
from flexinfer.runtime.base import Endpoint, ModelView
from tests.proxy.conftest import Stack, fast_settings, model


def stubs_of(stack: Stack, n: int) -> list:  # type: ignore[type-arg]
    while len(stack.stubs) < n:
        stack.add_stub()
    return stack.stubs[:n]


def which(stack: Stack) -> dict[int, int]:
    """stub index -> requests it received."""
    return {i: len(s.requests) for i, s in enumerate(stack.stubs)}


def test_session_affinity_is_sticky_and_spread(stack: Stack) -> None:
    stubs = stubs_of(stack, 3)
    stack.start_proxy([model("m", *stubs, routing="session-affinity")], fast_settings())
    c = openai.OpenAI(base_url=stack.base_url, api_key="k", max_retries=0)
    placement: dict[str, set[str]] = collections.defaultdict(set)
    for sid in range(30):
        for _ in range(4):
            r = c.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": "x"}], extra_headers={"X-Session-ID": f"s{sid}"})
            strategy, source, ep = r.headers["x-flexinfer-route"].split(";")
            assert (strategy, source) == ("session-affinity", "session-header")
            placement[f"s{sid}"].add(ep)
            # the replica's load was released before the client had the last byte, so the next
            # request of the session never finds its replica "busy" with the one just answered
            assert stack.handler.router.in_flight == {}, (sid, stack.handler.router.in_flight)
    assert all(len(eps) == 1 for eps in placement.values())
    used = collections.Counter(next(iter(eps)) for eps in placement.values())
    # 30 sessions over 3 replicas: all are used. (How evenly is the ring's own property, tested with
    # tests/speedups; here the replicas' ports are random, and with them each one's share of the
    # ring, so "at least 4 each" failed now and then: 14 / 13 / 3 in one run.)
    assert len(used) == 3, used


def test_message_hash_session_key(stack: Stack) -> None:
    stubs = stubs_of(stack, 3)
    stack.start_proxy([model("m", *stubs, routing="session-affinity")], fast_settings())
    c = openai.OpenAI(base_url=stack.base_url, api_key="k", max_retries=0)
    eps = set()
    for _ in range(5):
        r = c.chat.completions.with_raw_response.create(model="m", messages=[{"role": "user", "content": "conv-1"}])
        _strategy, source, ep = r.headers["x-flexinfer-route"].split(";")
        assert source == "messages"
        eps.add(ep)
    assert len(eps) == 1


def test_shared_system_prompt_returns_to_its_replica(stack: Stack) -> None:
    stubs = stubs_of(stack, 3)
    stack.start_proxy([model("m", *stubs, routing="prefix-cache")], fast_settings())
    c = openai.OpenAI(base_url=stack.base_url, api_key="k", max_retries=0)
    systems = [f"You are assistant number {i}. " + "Follow these rules carefully. " * 200 for i in range(3)]
    first: dict[int, str] = {}
    for round_ in range(4):
        for i, system in enumerate(systems):
            r = c.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "system", "content": system},
                                     {"role": "user", "content": f"question {round_}"}])
            _, source, ep = r.headers["x-flexinfer-route"].split(";")
            if round_ == 0:
                first[i] = ep
            else:
                assert ep == first[i]
                assert source.startswith("prefix-match-")
                assert int(source.rsplit("-", 1)[1]) >= len(system) // 64  # the whole system prompt matched


def test_least_loaded_spreads_concurrent_slow_requests(stack: Stack) -> None:
    stubs = stubs_of(stack, 3)
    stack.start_proxy([model("m", *stubs, routing="least-loaded")], fast_settings())
    c = openai.OpenAI(base_url=stack.base_url, api_key="k", max_retries=0)

    def call(_: int) -> None:
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                  extra_headers={"x-stub-delay": "0.6"})

    with concurrent.futures.ThreadPoolExecutor(30) as pool:
        list(pool.map(call, range(30)))
    counts = sorted(which(stack).values())
    assert sum(counts) == 30
    assert counts[-1] - counts[0] <= 2, counts


def test_route_header_can_be_turned_off(stack: Stack) -> None:
    stack.start_proxy([model("m", stack.stub)], fast_settings(route_header=False))
    c = openai.OpenAI(base_url=stack.base_url, api_key="k", max_retries=0)
    r = c.chat.completions.with_raw_response.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert "x-flexinfer-route" not in r.headers
    assert json.loads(stack.stub.requests[0].body)["model"] == "m"


class H(dict):  # type: ignore[type-arg]
    def get(self, name, default=None):  # type: ignore[no-untyped-def, override]
        return super().get(name, default)


def view(n: int, routing: str = "session-affinity", start: int = 0) -> ModelView:
    return ModelView("m", endpoints=tuple(Endpoint("10.0.0.1", 9000 + i) for i in range(start, start + n)),
                     routing=routing)


def test_endpoint_removal_moves_only_its_keys() -> None:
    r = Router()
    before = {k: r.pick(view(5), None, H({b"x-session-id": f"k{k}".encode()}))[0].key for k in range(5000)}
    smaller = view(5)
    smaller = ModelView("m", endpoints=smaller.endpoints[:4], routing="session-affinity")
    after = {k: r.pick(smaller, None, H({b"x-session-id": f"k{k}".encode()}))[0].key for k in range(5000)}
    removed = view(5).endpoints[4].key
    moved = [k for k in before if before[k] != after[k]]
    assert all(before[k] == removed for k in moved)
    assert len(moved) <= 1.2 * 5000 / 5


def test_keys() -> None:
    assert session_key({"messages": [{"role": "user", "content": "a"}]}, H())[0].startswith("msg:")  # type: ignore[union-attr]
    assert session_key({"session_id": "abc"}, H()) == ("abc", "body-session")
    assert session_key(None, H({b"x-conversation-id": b"c1"})) == ("c1", "conversation-header")
    assert prefix_key({"cache_key": "Team/Doc=1"}, H()) == ("team/doc=1", "cache-key")
    assert prefix_key({"cache_key": "bad key!"}, H())[1] != "cache-key"
    assert prefix_key({"prefix": "p" * 2000}, H()) == ("p" * 512, "prefix")
    sys_key = prefix_key({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "u"}]}, H())
    assert sys_key == ("S", "system")
    assert prefix_key(None, H({b"x-flexinfer-cache-key": b"K1"})) == ("k1", "cache-key-header")


def test_prefix_store_bounded_shared_by_endpoints_and_forget() -> None:
    r = random.Random(7)
    h = [r.getrandbits(64) for _ in range(12)]  # block hashes are 64-bit (the low 16 bits name the endpoint)
    s = PrefixStore(sets=1)  # one 64-byte set: 8 hashes for every endpoint together
    s.record("a", h[:8])
    assert s.match_len("a", h[:8]) == 8
    assert s.match_len("a", [*h[:3], h[11]]) == 3
    assert s.match_lens(["a", "b", "a"], h[:8]) == [8, 0, 8]
    s.record("b", h[8:11])  # the table is full: b's blocks replace some of a's
    assert s.match_len("b", h[8:11]) == 3
    assert s.match_len("a", h[:8]) < 8
    s.forget("a")
    assert s.match_len("a", h[:1]) == 0 and s.endpoints() == ["b"]
    s.record("c", h[7:8])  # the forgotten id is reused, without a's old blocks
    assert s.match_len("c", h[:1]) == 0 and s.match_len("c", h[7:8]) == 1


def test_prefix_hints_are_per_model_through_the_seed() -> None:
    r = Router()
    data = {"messages": [{"role": "system", "content": "shared system prompt " * 40}]}
    a = ModelView("a", endpoints=(Endpoint("10.0.0.1", 1), Endpoint("10.0.0.2", 1)), routing="prefix-cache")
    b = ModelView("b", endpoints=a.endpoints, routing="prefix-cache")
    ep, _, source = r.pick(a, data, H())
    assert source == "prefix-miss"
    again, _, source = r.pick(a, data, H())
    assert again == ep and source.startswith("prefix-match-")  # a's prompt, seen on ep
    assert r.pick(b, data, H())[2] == "prefix-miss"  # the same text for another model is not a hit


def test_prefix_store_cleaned_when_endpoint_leaves() -> None:
    r = Router()
    data = {"messages": [{"role": "system", "content": "x" * 1000}]}
    v = view(2, "prefix-cache")
    ep, _, _ = r.pick(v, data, H())
    assert ep.key in r.prefixes.endpoints()
    remaining = tuple(e for e in v.endpoints if e.key != ep.key)
    r.pick(ModelView("m", endpoints=remaining, routing="prefix-cache"), data, H())
    assert ep.key not in r.prefixes.endpoints()
