"""A broken kubeconfig is one error line from the command (file:line for bad YAML), never a
traceback or kopf's endless login retries (flexinfer.k8s.client.kubeconfig_problem)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flexinfer.k8s.client import kubeconfig_problem

ROOT = Path(__file__).resolve().parents[2]
GOOD = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: u, user: {}}]
contexts: [{name: ctx, context: {cluster: c, user: u}}]
current-context: ctx
"""


@pytest.mark.parametrize(("text", "words"), [
    (None, "No such file or directory"),
    ("clusters: [\n", "bad.yaml:2: not YAML"),
    ("- a list\n", "not a kubeconfig"),
    ("apiVersion: v1\nkind: Config\nclusters: []\n", "no current-context"),
    (GOOD.replace("current-context: ctx", "current-context: other"), "current-context 'other' is not among"),
])
def test_what_is_wrong_is_said(tmp_path: Path, text: str | None, words: str) -> None:
    path = tmp_path / "bad.yaml"
    if text is not None:
        path.write_text(text)
    why = kubeconfig_problem(str(path))
    assert why is not None and words in why and str(path) in why, why


def test_a_usable_file_and_the_pod_account_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ok.yaml").write_text(GOOD)
    assert kubeconfig_problem(str(tmp_path / "ok.yaml")) is None
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert kubeconfig_problem(None) is None  # in a pod the service account is used
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent.yaml"))
    assert kubeconfig_problem(None) is None  # no default file: nothing to check (the client says)
    (tmp_path / "broken.yaml").write_text("current-context: x\n")
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'broken.yaml'}{os.pathsep}{tmp_path / 'ok.yaml'}")
    assert "current-context 'x'" in (kubeconfig_problem(None) or "")  # the first path is the one used


@pytest.mark.parametrize("command", [["operator"], ["agent"], ["extender", "--port", "0"]])
def test_commands_stop_with_one_line(tmp_path: Path, command: list[str]) -> None:
    bad = tmp_path / "kc.yaml"
    bad.write_text("apiVersion: v1\nkind: Config\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NODE_NAME": "n1"}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    out = subprocess.run([sys.executable, "-m", "flexinfer.cli", "--log-level", "warning", *command,
                          "--kubeconfig", str(bad)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    said = out.stdout + out.stderr
    assert out.returncode == 2, said
    assert f"kubeconfig {bad}: no current-context" in said and "Traceback" not in said, said
