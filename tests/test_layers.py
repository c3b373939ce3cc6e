"""The layering rules of DESIGN.md, checked by walking every module's imports (AST, no execution)."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "flexinfer"
KUBE_LIBS = ("kubernetes_asyncio", "kopf", "kubernetes")
KUBE_ALLOWED = ("flexinfer.k8s", "flexinfer.runtime.kube", "flexinfer.operator", "flexinfer.scheduler", "flexinfer.agent",
                "flexinfer.tps")


def modules() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        imports: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imports.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imports.add(node.module)
                imports.update(f"{node.module}.{a.name}" for a in node.names)
        out[name] = imports
    return out


def test_layers() -> None:
    mods = modules()
    assert "flexinfer.proxy.pipeline" in mods
    problems = []
    for name, imps in mods.items():
        ours = {i for i in imps if i.startswith("flexinfer")}
        if name.startswith("flexinfer._speedups") and ours:
            problems.append(f"{name}: _speedups imports nothing of ours, found {sorted(ours)}")
        if name.startswith("flexinfer.http") and any(
                i.startswith(("flexinfer.proxy", "flexinfer.runtime", "flexinfer.api")) for i in ours):
            problems.append(f"{name}: http knows no models, found {sorted(ours)}")
        if name.startswith("flexinfer.proxy"):
            bad = [i for i in ours if i.startswith("flexinfer.runtime") and not i.startswith("flexinfer.runtime.base")]
            if bad:
                problems.append(f"{name}: proxy knows runtime.base only, found {bad}")
        if name.startswith("flexinfer.runtime") and any(i.startswith("flexinfer.operator") for i in ours):
            problems.append(f"{name}: the runtime knows no operator (the shared pure rules live outside it), "
                            f"found {sorted(i for i in ours if i.startswith('flexinfer.operator'))}")
        if any(i.split(".")[0] in KUBE_LIBS for i in imps) and not name.startswith(KUBE_ALLOWED):
            problems.append(f"{name}: only kube/operator/scheduler/agent/tps may import the Kubernetes client")
    assert not problems, "\n".join(problems)
