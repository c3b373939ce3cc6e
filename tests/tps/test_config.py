"""bench runner configuration: base-URL precedence, environment names, invalid values."""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer import tps
from flexinfer.settings import SettingsError

# ---- config ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("env", "flags", "url"), [
    ({}, {}, "http://flexinfer-proxy.flexinfer-system.svc.cluster.local:80/v1"),
    ({"BENCHMARK_PROXY_NAMESPACE": "ops"}, {}, "http://flexinfer-proxy.ops.svc.cluster.local:80/v1"),
    ({"BENCHMARK_PROXY_URL": "http://b:8080"}, {}, "http://b:8080/v1"),
    ({"BENCHMARK_PROXY_URL": "http://b:8080", "PROXY_URL": "http://a/"}, {}, "http://a/v1"),
    ({"PROXY_URL": "http://a/v1"}, {}, "http://a/v1"),
    ({"PROXY_URL": "http://a"}, {"base_url": "https://api.example/v1/"}, "https://api.example/v1"),
])
def test_base_url_precedence(env: dict[str, str], flags: dict[str, Any], url: str) -> None:
    assert tps.load_config(env, **flags).base_url == url


def test_env_names() -> None:
    cfg = tps.load_config({"MODEL_NAME": "m", "POD_NAMESPACE": "ns", "NODE_NAME": "n1",
                           "BENCHMARK_RESULTS_CONFIGMAP": "g", "OPENAI_API_KEY": "k"}, namespace=None)
    assert (cfg.model, cfg.namespace, cfg.node_name, cfg.global_configmap, cfg.bearer) == ("m", "ns", "n1", "g", "k")
    assert tps.load_config({"MODEL_NAME": "m"}, model="flag").model == "flag"


@pytest.mark.parametrize("flags", [{"iterations": 0}, {"warmup": -1}, {"min_duration": -1.0},
                                   {"base_url": "ftp://x"}, {"max_tokens": 0}])
def test_config_errors(flags: dict[str, Any]) -> None:
    with pytest.raises(SettingsError):
        tps.load_config({}, **flags)
