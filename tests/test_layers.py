"""The import rules of docs/architecture.md (R1-R7), checked by walking every module's imports
(AST, no execution; imports inside functions count too)."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "flexinfer"

GROUND = ("flexinfer", "_compiled", "_nocython", "errors", "labels", "logs", "settings", "sharing",
          "units")  # "flexinfer": the package root
# docs/architecture.md, "The parts": the floor of each part
FLOORS: dict[str, int] = {
    "_speedups": 0, **{g: 0 for g in GROUND},
    "http": 1, "k8s": 1, "backends": 1, "api": 1,
    "proxy": 2, "runtime": 2, "operator": 2, "scheduler": 2, "agent": 2, "tps": 2, "flashloader": 2,
    "cmd": 3, "cli": 3,
}
# R2: the only imports allowed between parts of the same floor (importer -> imported, by prefix)
SAME_FLOOR: dict[str, tuple[str, ...]] = {
    **{g: ("_speedups", *GROUND) for g in GROUND},
    "api": ("backends",),
    "proxy": ("runtime.base",),
}
PROXY_FLOOR_1 = ("http",)  # R3
KUBE_LIBS = ("kubernetes_asyncio", "kopf", "kubernetes")
KUBE_ALLOWED = ("k8s", "runtime.kube", "operator", "scheduler", "agent", "tps")  # R5
OTEL_ALLOWED = ("flexinfer.proxy.tracing",)  # R6: the optional otel extra, imported there only (lazily)
NO_PROMETHEUS_CLIENT = ("http", "proxy")  # R7: the proxy process's metrics are flexinfer.proxy.prom


def modules() -> dict[str, set[str]]:
    """Module name (``flexinfer.proxy.pipeline``; ``flexinfer`` for the root) -> the names it imports."""
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


def part(name: str) -> str | None:
    """The part a module (or an imported name) belongs to; None when it is not ours."""
    if name == "flexinfer":
        return "flexinfer"
    if not name.startswith("flexinfer."):
        return None
    head = name.split(".")[1]
    if head in FLOORS:
        return head
    return "flexinfer" if head.startswith("__") else None  # ``from flexinfer import __version__``: the root


def check(mods: dict[str, set[str]]) -> list[str]:
    problems: list[str] = []
    for name in sorted(mods):
        me = part(name)
        assert me is not None, f"{name}: a module of no part; add it to docs/architecture.md and FLOORS"
        for imp in sorted(i for i in mods[name] if part(i) is not None):
            other = part(imp)
            assert other is not None
            if other == me:
                continue  # its own part
            if me == "_speedups":
                problems.append(f"R1 {name}: _speedups imports nothing of ours, found {imp}")
                continue
            if me == "cli":
                problems.append(f"R4 {name}: cli imports nothing of ours (commands by name), found {imp}")
                continue
            if me == "proxy" and FLOORS[other] == 1 and other not in PROXY_FLOOR_1:
                problems.append(f"R3 {name}: the proxy imports http only of floor 1, found {imp}")
                continue
            below = FLOORS[other] < FLOORS[me]
            allowed_peer = FLOORS[other] == FLOORS[me] and imp.removeprefix("flexinfer.").startswith(
                SAME_FLOOR.get(me, ()))
            if not (below or allowed_peer):
                problems.append(f"R2 {name}: imports only its own part and lower floors "
                                f"({me} is floor {FLOORS[me]}, {other} floor {FLOORS[other]}), found {imp}")
        kube = sorted(i for i in mods[name] if i.split(".")[0] in KUBE_LIBS)
        if kube and not (name + ".").startswith(tuple(f"flexinfer.{k}." for k in KUBE_ALLOWED)):
            problems.append(f"R5 {name}: only {', '.join(KUBE_ALLOWED)} import a Kubernetes client, found {kube}")
        otel = sorted(i for i in mods[name] if i.split(".")[0] == "opentelemetry")
        if otel and name not in OTEL_ALLOWED:
            problems.append(f"R6 {name}: only {', '.join(OTEL_ALLOWED)} imports opentelemetry, found {otel}")
        prometheus = sorted(i for i in mods[name] if i.split(".")[0] == "prometheus_client")
        if prometheus and part(name) in NO_PROMETHEUS_CLIENT:
            problems.append(f"R7 {name}: the proxy and the HTTP core do not import prometheus_client "
                            f"(flexinfer.proxy.prom), found {prometheus}")
    return problems


def test_every_module_has_a_part() -> None:
    mods = modules()
    assert "flexinfer.proxy.pipeline" in mods and "flexinfer" in mods and "flexinfer.cli" in mods
    assert not [m for m in mods if part(m) is None]


def test_layers() -> None:
    problems = check(modules())
    assert not problems, "\n".join(problems)


def test_rules_catch_what_they_name() -> None:
    """Each rule fires on a module that breaks it (so a typo in the tables cannot silence one)."""
    bad = {
        "flexinfer._speedups.x": {"flexinfer.errors"},
        "flexinfer": {"flexinfer._speedups"},  # allowed (floor 0 peers)
        "flexinfer.errors": {"flexinfer.http"},
        "flexinfer.http.x": {"flexinfer.api.model"},
        "flexinfer.runtime.x": {"flexinfer.proxy.pipeline"},
        "flexinfer.runtime.y": {"flexinfer.operator.rules"},
        "flexinfer.proxy.x": {"flexinfer.runtime.kube", "flexinfer.k8s.client"},
        "flexinfer.api.x": {"flexinfer.backends"},  # allowed
        "flexinfer.k8s.x": {"flexinfer.cmd.proxy"},
        "flexinfer.cli": {"flexinfer.cmd.proxy"},
        "flexinfer.agent.x": {"kopf"},  # allowed
        "flexinfer.settings": {"kubernetes_asyncio"},
        "flexinfer.proxy.tracing": {"opentelemetry.sdk.trace"},  # allowed
        "flexinfer.proxy.pipeline": {"opentelemetry.trace"},
        "flexinfer.proxy.y": {"prometheus_client.parser"},
        "flexinfer.operator.x": {"prometheus_client"},  # allowed
    }
    found = check(bad)
    rules = sorted({p.split()[0] + " " + p.split()[1].rstrip(":").removeprefix("flexinfer.") for p in found})
    assert rules == sorted([
        "R1 _speedups.x", "R2 errors", "R2 http.x", "R2 runtime.x", "R2 runtime.y", "R2 proxy.x", "R3 proxy.x",
        "R2 k8s.x", "R4 cli", "R5 settings", "R6 proxy.pipeline", "R7 proxy.y",
    ]), found


def test_tracing_imports_opentelemetry_only_inside_functions() -> None:
    """R6: flexinfer.proxy.tracing loads opentelemetry lazily (with tracing on), never at import."""
    tree = ast.parse((PKG / "proxy" / "tracing.py").read_text())
    top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
    assert not [m for m in names if m.split(".")[0] == "opentelemetry"]
