"""The single-process proxy's resident memory (issue 15: peak RSS <= 40 MiB): modules that only
some configurations need are imported when used, not by every ``flexinfer proxy``. Checked in a
fresh interpreter that imports what ``flexinfer proxy -c FILE`` imports and builds a handler."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# module -> the configuration that needs it, or why no proxy needs it
LAZY = {
    "multiprocessing": "--workers N (flexinfer.proxy.machine.MachineState's lock)",
    "ctypes": "--workers N (a worker's parent-death signal, flexinfer.http.workers)",
    "prometheus_client": "none: the proxy's metrics are flexinfer.proxy.prom, engine pages are read by "
                         "flexinfer.proxy.enginemetrics (its package imports the stdlib below, 4.4 MB)",
    "urllib.request": "none (prometheus_client's push client imported it)",
    "http.server": "none (prometheus_client's exposition server imported it)",
    "wsgiref": "none (prometheus_client's exposition server imported it)",
    "email": "none (email.utils.formatdate wrote the Date header: flexinfer.http.responses.http_date)",
}
#: loaded by the pure-Python twins themselves (FLEXINFER_NO_EXTENSIONS=1: shmstate_py's atomics)
PURE_NEEDS = frozenset({"ctypes"})

SCRIPT = textwrap.dedent("""
    import sys
    from flexinfer.cli import build_parser
    build_parser(["proxy"])
    import flexinfer.cmd.proxy, flexinfer.cmd.workers, flexinfer.http.server, flexinfer.runtime.static
    from flexinfer.proxy.pipeline import ProxyHandler
    from flexinfer.runtime.static import StaticInventory
    from flexinfer.settings import load_proxy_settings
    inv = StaticInventory.from_file(sys.argv[1])
    ProxyHandler(inv, load_proxy_settings())
    import flexinfer._speedups as speedups
    print(speedups.IMPLEMENTATION, *sorted(m for m in {names} if m in sys.modules))
""")


def test_the_proxy_does_not_import_what_only_other_setups_need(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "inventory.yaml"
    cfg.write_text("models:\n  - name: m\n    endpoints: [http://127.0.0.1:9]\n")
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(names=sorted(LAZY)), str(cfg)],
                         capture_output=True, text=True, timeout=60, check=True)
    implementation, *loaded = out.stdout.split()
    if implementation != "c":  # the pure twins run: what they need themselves is allowed
        loaded = [m for m in loaded if m not in PURE_NEEDS]
    assert loaded == [], {m: LAZY[m] for m in loaded}


def test_the_lazy_paths_still_work() -> None:
    from flexinfer.proxy.machine import MachineState

    state = MachineState(2)
    with state.lock:  # the fork-context lock, made on first use of the module
        pass


GC_SCRIPT = textwrap.dedent("""
    import gc, sys
    import flexinfer.http.server as server
    def serve(*args, **kwargs):  # what `flexinfer proxy` leaves the serving process with
        print(*gc.get_threshold(), gc.get_freeze_count())
        return 0
    server.run = serve
    from flexinfer.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_the_serving_process_collects_its_young_generation_rarely(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``flexinfer proxy`` hands the server a process whose young-generation threshold is
    GC_YOUNG_THRESHOLD (CPython's 700 walked the in-flight requests every few requests: 3.7 % of the
    CPU under load), the older ratios CPython's, and the startup heap frozen."""
    import gc

    from flexinfer.cmd.proxy import GC_YOUNG_THRESHOLD

    cfg = tmp_path / "inventory.yaml"
    cfg.write_text("models:\n  - name: m\n    endpoints: [http://127.0.0.1:9]\n")
    out = subprocess.run([sys.executable, "-c", GC_SCRIPT, "proxy", "-c", str(cfg)],
                         capture_output=True, text=True, timeout=60, check=True)
    young, older, oldest, frozen = (int(v) for v in out.stdout.split())
    assert GC_YOUNG_THRESHOLD > 700 and young == GC_YOUNG_THRESHOLD
    assert (older, oldest) == gc.get_threshold()[1:]
    assert frozen > 1000
