"""Hostile input: any JSON as an object or spec gives a typed view or a SpecError, never another
exception (the operator puts the reason on a condition instead of crashing a handler)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexinfer.api import PARSERS, SpecError, format_duration, parse, parse_duration

SCALARS = st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats(allow_nan=False, allow_infinity=False) \
    | st.sampled_from(["", "auto", "cpu", "nvidia", "5m", "HF://a/b", "pvc://c/p", "vllm", "llamacpp", "Memory",
                       "Failover", "True", "x" * 300])
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(["backend", "source", "gpu", "vendor", "count", "shared",
                                                       "priority", "serverless", "cache", "strategy", "config",
                                                       "status", "phase", "conditions", "type", "models", "name",
                                                       "clusters", "placement", "template", "registries", "x"]),
                                      inner, max_size=6), max_leaves=25)

BASE_SPECS: dict[str, dict[str, Any]] = {
    "Model": {"backend": "vllm", "source": "HF://a/b", "gpu": {}},
    "GPUGroup": {"models": [{"name": "a"}]},
    "GlobalProxy": {"clusters": [{"name": "a", "endpoint": "https://a"}]},
}


def _ok_or_spec_error(obj: Any) -> None:
    try:
        parse(obj)
    except SpecError as e:
        assert e.reason and e.reason[0].isupper()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(sorted(PARSERS)), spec=JSON, status=JSON, meta=JSON)
def test_any_json_gives_a_view_or_spec_error(kind, spec, status, meta):
    _ok_or_spec_error({"kind": kind, "metadata": meta, "spec": spec, "status": status})
    _ok_or_spec_error({"kind": kind, "metadata": {"name": "n"}, "spec": spec, "status": status})


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(sorted(BASE_SPECS)), key=st.sampled_from(["gpu", "serverless", "cache", "config",
                                                                       "models", "clusters", "strategy", "x"]),
       value=JSON)
def test_one_bad_field_in_a_good_spec(kind, key, value):
    spec = {**BASE_SPECS[kind], key: value}
    _ok_or_spec_error({"kind": kind, "metadata": {"name": "n"}, "spec": spec, "status": value})


@given(st.integers(0, 10**7))
def test_duration_roundtrip(seconds):
    assert parse_duration(format_duration(seconds)) == seconds


@given(st.text(max_size=12))
def test_duration_never_crashes(text):
    try:
        assert parse_duration(text) >= 0
    except SpecError as e:
        assert e.reason == "InvalidSpec"
