"""The chart's Redis for the proxy replicas: an external URL (plain or from a Secret) or its own
single-instance Redis (``redis.deploy``); what the proxy is told, and the rendered Redis run for real.

Validity (kubernetes-validate, two Kubernetes versions) and lint of both modes are in test_render.py's
matrix (``redis-deploy``, ``redis-external``); this file checks the wiring."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
from prometheus_client import CollectorRegistry

from flexinfer.proxy.redisshare import RedisShare
from flexinfer.settings import HTTPSettings, ProxySettings, UpstreamSettings, load_proxy_settings
from tests.chart.helpers import (
    NAMESPACE,
    container,
    containers,
    env_of,
    notes,
    of_kind,
    one,
    pod_spec,
    render,
)
from tests.harness import free_port, reach
from tests.redis_server import REDIS_SERVER, RedisServer

KNOWN_ENV = {f.metadata.get("env") for cls in (ProxySettings, HTTPSettings, UpstreamSettings) for f in fields(cls)}


def proxy_env(objs: list[dict[str, Any]]) -> dict[str, Any]:
    env = env_of(container(one(objs, "Deployment", "proxy"), "proxy"))
    assert set(env) <= KNOWN_ENV, set(env) - KNOWN_ENV  # nothing the code ignores
    return env


def settings_of(env: Mapping[str, Any], **resolved: str) -> ProxySettings:
    """The proxy's settings from its rendered env, field references resolved as the kubelet would."""
    plain = {k: v for k, v in env.items() if isinstance(v, str)} | resolved
    return load_proxy_settings(plain)


def redis_objects(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["metadata"]["labels"]["app.kubernetes.io/component"] == "redis"]


def test_off_by_default() -> None:
    objs = render({})
    assert redis_objects(objs) == []
    assert not any(k.startswith("PROXY_REDIS") or k == "PROXY_REPLICA_ID" for k in proxy_env(objs))
    assert settings_of(proxy_env(objs), POD_NAMESPACE="x").redis_url == ""


def test_external_url() -> None:
    objs = render({"redis": {"url": "rediss://redis.example.com:6380/2", "prefix": "prod",
                             "timeoutSeconds": 0.25, "syncIntervalSeconds": 0.5}})
    assert redis_objects(objs) == []  # nothing of ours to run
    env = proxy_env(objs)
    assert env["PROXY_REPLICA_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    s = settings_of(env, POD_NAMESPACE=NAMESPACE, PROXY_REPLICA_ID="flexinfer-proxy-5d8f9-x2x7q")
    assert (s.redis_url, s.redis_prefix, s.redis_timeout, s.redis_sync_interval, s.replica_id) == \
        ("rediss://redis.example.com:6380/2", "prod", 0.25, 0.5, "flexinfer-proxy-5d8f9-x2x7q")
    # the prefix defaults to the release's full name: two releases on one Redis keep apart
    assert proxy_env(render({"redis": {"url": "redis://r:6379/0"}}, name="staging"))["PROXY_REDIS_PREFIX"] == \
        "staging-flexinfer"


def test_url_from_a_secret() -> None:
    objs = render({"redis": {"existingSecret": "redis-url", "secretKey": "uri"}})
    env = proxy_env(objs)
    assert env["PROXY_REDIS_URL"] == {"secretKeyRef": {"name": "redis-url", "key": "uri"}}
    assert env["PROXY_REDIS_PREFIX"] == "flexinfer"


def test_deployed_redis_is_wired_to_the_proxy() -> None:
    objs = render({"redis": {"deploy": True}, "networkPolicy": {"enabled": True},
                   "global": {"imageRegistry": "mirror.example:5000", "imagePullSecrets": ["regcred"]}})
    dep, svc = one(objs, "Deployment", "redis"), one(objs, "Service", "redis")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    spec = pod_spec(dep)
    (c,) = containers(dep)
    assert c["image"] == "mirror.example:5000/library/redis:7.2-alpine"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    # the Service selects the pod and reaches its named port
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in svc["spec"]["selector"].items())
    (port,) = svc["spec"]["ports"]
    assert port["targetPort"] == c["ports"][0]["name"] and port["port"] == c["ports"][0]["containerPort"] == 6379
    s = settings_of(proxy_env(objs), POD_NAMESPACE=NAMESPACE, PROXY_REPLICA_ID="p-1")
    assert s.redis_url == f"redis://{svc['metadata']['name']}.{NAMESPACE}.svc.cluster.local:6379/0"
    # only the proxy pods may connect (the Redis has no password)
    (pol,) = [p for p in of_kind(objs, "NetworkPolicy") if p["metadata"]["name"] == dep["metadata"]["name"]]
    proxy_labels = one(objs, "Deployment", "proxy")["spec"]["template"]["metadata"]["labels"]
    (rule,) = pol["spec"]["ingress"]
    (peer,) = rule["from"]
    assert all(proxy_labels[k] == v for k, v in peer["podSelector"]["matchLabels"].items())
    assert pol["spec"]["podSelector"]["matchLabels"] == svc["spec"]["selector"]
    assert rule["ports"] == [{"port": "redis", "protocol": "TCP"}]
    # no proxy, no Redis
    assert redis_objects(render({"redis": {"deploy": True}, "proxy": {"enabled": False}})) == []


def test_notes_name_the_redis() -> None:
    assert "Redis" not in notes({})
    assert "through Redis (redis://flexinfer-redis.flexinfer-system.svc.cluster.local:6379/0)" in \
        notes({"redis": {"deploy": True}})
    assert "URL from Secret redis-url" in notes({"redis": {"existingSecret": "redis-url"}})


@pytest.mark.parametrize(("values", "message"), [
    ({"redis": {"deploy": True, "url": "redis://r:6379/0"}}, "redis.deploy runs the chart's own Redis"),
    ({"redis": {"url": "redis://r:6379/0", "existingSecret": "s"}}, "not both"),
])
def test_conflicting_values_fail(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError, match=message):
        render(values)


@pytest.mark.parametrize(("values", "message"), [
    ({"redis": {"url": "http://redis:6379"}}, "at '/redis/url'"),
    ({"redis": {"timeoutSeconds": 0}}, "at '/redis/timeoutSeconds'"),
    ({"redis": {"prefix": "a b"}}, "at '/redis/prefix'"),
    ({"redis": {"maxmemory": "lots"}}, "at '/redis/maxmemory'"),
    ({"redis": {"deploi": True}}, "additional properties 'deploi' not allowed"),
])
def test_bad_values_fail_with_the_schemas_message(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmValuesError) as e:
        render(values)
    assert message in str(e.value)


@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server not installed (make redis-server)")
@pytest.mark.timeout(60)
def test_rendered_redis_runs_and_the_proxy_shares_through_it(tmp_path: Path) -> None:
    """The Redis container's exact command and args (port and --dir mapped to this machine) run with
    the local redis-server; a RedisShare built from the proxy's rendered env shares through it."""
    objs = render({"redis": {"deploy": True}})
    (c,) = containers(one(objs, "Deployment", "redis"))
    args = list(c["args"])
    port = free_port()
    args[args.index("--port") + 1] = str(port)
    args[args.index("--dir") + 1] = str(tmp_path)
    assert c["command"] == ["redis-server"]
    proc = subprocess.Popen([str(REDIS_SERVER), *args, "--bind", "127.0.0.1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    srv = RedisServer(port)  # for its raw client only (it does not own this process)
    try:
        end = time.monotonic() + 10
        while not srv.ping():
            assert proc.poll() is None and time.monotonic() < end, "the rendered redis-server did not start"
            time.sleep(0.02)
        for name, want in (("save", b""), ("appendonly", b"no"), ("maxmemory-policy", b"noeviction"),
                           ("protected-mode", b"no")):
            assert srv.command("CONFIG", "GET", name).split(b"\r\n")[4] == want, name
        assert srv.command("CONFIG", "GET", "maxmemory").split(b"\r\n")[4] == str(96 * 1024 * 1024).encode()
        env = proxy_env(objs)
        s = settings_of(env, POD_NAMESPACE=NAMESPACE, PROXY_REPLICA_ID="flexinfer-proxy-abc")
        host = s.redis_url.split("//", 1)[1].split(":", 1)[0]
        assert host.endswith(f".{NAMESPACE}.svc.cluster.local")
        local = load_proxy_settings({**{k: v for k, v in env.items() if isinstance(v, str)},
                                     "PROXY_REDIS_URL": s.redis_url.replace(f"{host}:6379", f"127.0.0.1:{port}")})

        async def share() -> tuple[bool, dict[str, int]]:
            a = RedisShare(local, CollectorRegistry(), machine_id="pod-a", worker_id="0", local_load=lambda: {"e": 2})
            b = RedisShare(local, CollectorRegistry(), machine_id="pod-b", worker_id="0", local_load=dict)
            await a.start()
            await b.start()
            try:
                await reach(lambda: b.remote_in_flight == {"e": 2})
                return a.up and b.up, b.remote_in_flight
            finally:
                await a.stop()
                await b.stop()

        assert asyncio.run(share()) == (True, {"e": 2})
    finally:
        proc.kill()
        proc.wait(10)
        srv.close()
