"""The ModelCatalog controller: the real operator (kopf + our registry) on the Kubernetes emulator,
listing a real OCI registry (docker-registry) and local Hugging Face / Ollama servers.

What each test proves:

- ``examples/v1alpha2/catalog.yaml`` (its registry URLs pointed at the local servers, since
  huggingface.co, ollama.com and ghcr.io cannot be reached here; its ``hf-token`` Secret created)
  reaches ``Ready`` with the entries its filter (``gguf`` and ``*instruct*``) keeps from all three
  registries: names, sizes, formats and references usable as a source; the Secret's HF_TOKEN was
  sent; a steady-state sync (the interval passed, nothing changed upstream) writes nothing; a new
  artifact pushed upstream appears at the next sync (one status write);
- a failing registry (a closed port; a missing Secret) is a condition with its reason while the
  other registries of the same catalog still sync, and one that fails later keeps its last entries;
- the status stays bounded (entries cut at the count and byte bounds, ``totalModels`` counts all,
  ``truncated`` says so) — the pure ``plan_status``.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from flexinfer.api.catalog import CatalogRegistry, ModelCatalog
from flexinfer.api.model import SOURCE_PATTERN
from flexinfer.operator import catalog
from flexinfer.operator.registries import Found, RegistryError
from tests.harness import free_port
from tests.kube_emulator import KubeEnv
from tests.oci_registry import DOCKER_REGISTRY, OCIRegistry
from tests.operator.harness import FakeClock, OperatorEnv, run_operator
from tests.operator.hub_servers import HubServer, OllamaServer, hf_model, ollama_model

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "v1alpha2" / "catalog.yaml"
CATALOGS = "ai.flexinfer/v1alpha2/modelcatalogs"
SECRETS = "v1/secrets"
GGUF = "application/vnd.ollama.image.model"
needs_registry = pytest.mark.skipif(DOCKER_REGISTRY is None,
                                    reason="docker-registry is not installed (make docker-registry: apt)")


def syncer(env: OperatorEnv) -> catalog.Syncer:
    fn = env.op.queues[catalog.CATALOG_Q].fn
    return fn.args[1]  # type: ignore[attr-defined, no-any-return]


def cond(env: OperatorEnv, name: str, type_: str) -> dict[str, Any]:
    return env.condition(name, type_, resource=CATALOGS)


def catalog_writes(env: OperatorEnv) -> int:
    return env.kube.write_count("modelcatalogs.ai.flexinfer")


@pytest_asyncio.fixture(name="upstreams")
async def upstreams_fixture(tmp_path: Path) -> AsyncIterator[tuple[OCIRegistry | None, HubServer, OllamaServer]]:
    reg = OCIRegistry(tmp_path / "registry").start() if DOCKER_REGISTRY else None
    hubsrv = await HubServer([
        hf_model("bartowski/Llama-3.2-1B-Instruct-GGUF", ["gguf", "text-generation"], ["a.Q4_K_M.gguf"], gguf=True),
        hf_model("Qwen/Qwen2.5-0.5B-Instruct-GGUF", ["gguf"], ["q.gguf"], gguf=True),
        hf_model("Qwen/Qwen2.5-0.5B-Instruct", ["safetensors"], ["model.safetensors"]),  # not gguf
        hf_model("TheBloke/base-GGUF", ["gguf"], ["b.gguf"], gguf=True),  # not *instruct*
    ], token="hf_example").start()
    ollama = await OllamaServer([ollama_model("llama3.2:3b-instruct-q4_K_M", 2019393189),
                                 ollama_model("gemma3:4b", 3338801804, family="gemma")]).start()
    try:
        yield reg, hubsrv, ollama
    finally:
        if reg is not None:
            reg.stop()
        await hubsrv.stop()
        await ollama.stop()


def example(reg: OCIRegistry, hubsrv: HubServer, ollama: OllamaServer) -> dict[str, Any]:
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"]["namespace"] = "default"
    regs = body["spec"]["registries"]
    urls = {"HuggingFace": hubsrv.url, "Ollama": ollama.url, "OCI": f"{reg.url}/example-org/models"}
    for r in regs:
        r["url"] = urls[r["type"]]
    return body  # type: ignore[no-any-return]


@needs_registry
async def test_example_catalog_syncs_and_steady_state_writes_nothing(
        kube: KubeEnv, upstreams: tuple[OCIRegistry | None, HubServer, OllamaServer]) -> None:
    reg, hubsrv, ollama = upstreams
    assert reg is not None
    await reg.push("example-org/models/phi-3-mini-instruct", "q4", [(b"p" * 4096, GGUF, {})])
    await reg.push("example-org/models/phi-3-mini-instruct", "fp16",
                   [(b"f" * 100, "application/octet-stream", {})],
                   annotations={"ai.flexinfer.model.format": "safetensors"})  # not gguf
    await reg.push("example-org/models/base", "q4", [(b"b" * 10, GGUF, {})])  # not *instruct*
    clock = FakeClock()
    async with run_operator(kube, clock=clock) as env:
        await env.create(SECRETS, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf-token"},
                                   "data": {"HF_TOKEN": base64.b64encode(b"hf_example").decode()}})
        await env.create(CATALOGS, example(reg, hubsrv, ollama))
        await env.wait_for(lambda: cond(env, "public-models", "Ready").get("status") == "True", 20, "Ready")
        st = env.status("public-models", resource=CATALOGS)
        refs = {e["reference"]: e for e in st["entries"]}
        assert set(refs) == {"HF://bartowski/Llama-3.2-1B-Instruct-GGUF", "HF://Qwen/Qwen2.5-0.5B-Instruct-GGUF",
                             "ollama://llama3.2:3b-instruct-q4_K_M",
                             f"oci://{reg.host}/example-org/models/phi-3-mini-instruct:q4"}
        assert st["totalModels"] == 4 and st["truncated"] is False and st["lastSyncTime"]
        oci_entry = refs[f"oci://{reg.host}/example-org/models/phi-3-mini-instruct:q4"]
        assert oci_entry == {"name": "phi-3-mini-instruct:q4", "registry": "OCI", "format": "gguf", "sizeBytes": 4096,
                             "reference": f"oci://{reg.host}/example-org/models/phi-3-mini-instruct:q4"}
        assert refs["ollama://llama3.2:3b-instruct-q4_K_M"]["sizeBytes"] == 2019393189
        assert [cond(env, "public-models", f"Registry{i}Synced")["reason"] for i in range(3)] == ["Synced"] * 3
        assert {r["authorization"] for r in hubsrv.requests} == {"Bearer hf_example"}
        # the sources work where they belong: HF:// and ollama:// in a Model (the Model CRD's pattern)
        assert all(re.match(SOURCE_PATTERN, r) for r in refs if not r.startswith("oci://"))

        # steady state: the interval (24h) passes, nothing changed upstream -> a sync, no write
        await env.settle()
        s = syncer(env)
        syncs, writes, hub_calls = s.syncs, catalog_writes(env), len(hubsrv.requests)
        clock.advance(24 * 3600 + 1)
        env.op.trigger(catalog.CATALOG_Q, ("default", "public-models"))
        await env.wait_for(lambda: s.syncs > syncs, 20, "the second sync")
        await env.settle()
        assert len(hubsrv.requests) > hub_calls  # it did list again
        assert catalog_writes(env) == writes, env.kube.writes

        # an event that is not a spec change (a label) does not make it sync again before its time
        syncs = s.syncs
        await env.patch(CATALOGS, "default", "public-models", {"metadata": {"labels": {"team": "a"}}})
        await env.settle()
        assert s.syncs == syncs

        # something new upstream: the next sync writes it
        await reg.push("example-org/models/llama-3-8b-instruct", "q5", [(b"l" * 77, GGUF, {})])
        clock.advance(24 * 3600 + 1)
        env.op.trigger(catalog.CATALOG_Q, ("default", "public-models"))
        await env.wait_for(lambda: env.status("public-models", resource=CATALOGS).get("totalModels") == 5, 20,
                           "the new artifact")


async def test_failing_registry_is_a_condition_others_still_sync(
        kube: KubeEnv, upstreams: tuple[OCIRegistry | None, HubServer, OllamaServer]) -> None:
    _reg, hubsrv, ollama = upstreams
    body = {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "ModelCatalog",
            "metadata": {"name": "mixed", "namespace": "default"},
            "spec": {"registries": [{"type": "OCI", "url": f"http://127.0.0.1:{free_port()}/models"},
                                    {"type": "Ollama", "url": ollama.url},
                                    {"type": "HuggingFace", "url": hubsrv.url, "secretRef": {"name": "missing"}}],
                     "syncInterval": "1h"}}
    async with run_operator(kube) as env:
        await env.create(CATALOGS, body)
        await env.wait_for(lambda: cond(env, "mixed", "Registry2Synced").get("reason"), 20, "conditions")
        assert cond(env, "mixed", "Registry0Synced")["reason"] == "Unreachable"
        assert cond(env, "mixed", "Registry1Synced")["status"] == "True"
        c2 = cond(env, "mixed", "Registry2Synced")
        assert (c2["status"], c2["reason"]) == ("False", "SecretNotFound") and "default/missing" in c2["message"]
        ready = cond(env, "mixed", "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "RegistryFailed") and "2 of 3" in ready["message"]
        st = env.status("mixed", resource=CATALOGS)
        assert sorted(e["reference"] for e in st["entries"]) == ["ollama://gemma3:4b",
                                                                 "ollama://llama3.2:3b-instruct-q4_K_M"]
        await env.wait_for(lambda: [e for e in env.events("mixed") if e.get("reason") == "RegistryFailed"], 10,
                           "the Warning event")


def _mc(*regs: CatalogRegistry, tags: tuple[str, ...] = (), pattern: str | None = None) -> ModelCatalog:
    spec: dict[str, Any] = {"registries": [{"type": r.type, **({"url": r.url} if r.url else {})} for r in regs]}
    if tags or pattern:
        spec["filter"] = {k: v for k, v in (("tags", list(tags)), ("namePattern", pattern)) if v}
    return ModelCatalog.from_obj({"apiVersion": "ai.flexinfer/v1alpha2", "kind": "ModelCatalog",
                                  "metadata": {"name": "c", "namespace": "default"}, "spec": spec})


def test_status_is_bounded_and_failed_registries_keep_their_entries() -> None:
    from datetime import UTC, datetime

    now = datetime(2025, 7, 1, tzinfo=UTC)
    oci_r, ol = CatalogRegistry("OCI", "r.example/models", None), CatalogRegistry("Ollama", None, None)
    mc = _mc(oci_r, ol, tags=("gguf",))
    many = [Found(f"m{i:04d}:q4", f"oci://r.example/models/m{i:04d}:q4", 1, "gguf", frozenset({"gguf"}))
            for i in range(50)]
    other = [Found("x:q4", "ollama://x:q4", 2, "safetensors", frozenset({"safetensors"}))]  # filtered out
    st = catalog.plan_status(mc, [catalog.Outcome(oci_r, many), catalog.Outcome(ol, other)], {}, 1, now,
                             max_entries=10)
    assert len(st["entries"]) == 10 and st["totalModels"] == 50 and st["truncated"] is True
    assert st["entries"][0]["name"] == "m0000:q4"
    st_bytes = catalog.plan_status(mc, [catalog.Outcome(oci_r, many), catalog.Outcome(ol, [])], {}, 1, now,
                                   max_bytes=1000)
    assert 0 < len(st_bytes["entries"]) < 50 and st_bytes["truncated"] is True
    # the worst case of the schema stays far below etcd's 1.5 MiB: 1000 entries at their longest
    huge = [Found("n" * 253 + str(i), "oci://" + "r" * 2000 + str(i), 2**62, "safetensors",
                  frozenset({"gguf"})) for i in range(3000)]
    st_huge = catalog.plan_status(mc, [catalog.Outcome(oci_r, huge), catalog.Outcome(ol, [])], {}, 1, now)
    assert len(json.dumps(st_huge)) < catalog.MAX_STATUS_BYTES + 8192 and st_huge["totalModels"] == 3000

    # the OCI registry fails next time: its entries of the last good sync stay, Ollama's refresh
    ok = catalog.plan_status(mc, [catalog.Outcome(oci_r, many[:3]),
                                  catalog.Outcome(ol, [Found("y", "ollama://y", 1, "gguf", frozenset({"gguf"}))])],
                             {}, 1, now)
    failed = catalog.plan_status(mc, [catalog.Outcome(oci_r, error=RegistryError("Unauthorized", "401")),
                                      catalog.Outcome(ol, [])], copy.deepcopy(ok), 1, now)
    assert [e["reference"] for e in failed["entries"]] == [e["reference"] for e in ok["entries"]][:3]
    c0 = next(c for c in failed["conditions"] if c["type"] == "Registry0Synced")
    assert (c0["status"], c0["reason"]) == ("False", "Unauthorized") and "keeping 3 entries" in c0["message"]
    # a registry removed from the spec loses its condition
    shrunk = catalog.plan_status(_mc(ol), [catalog.Outcome(ol, [])], failed, 2, now)
    assert sorted(c["type"] for c in shrunk["conditions"]) == ["Ready", "Registry0Synced"]
