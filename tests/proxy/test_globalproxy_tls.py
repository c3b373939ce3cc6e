"""``flexinfer proxy --global --kube`` with the GlobalProxy's ``spec.tls.secretRef`` (docs/globalproxy.md):
mTLS towards the members, the Secret read from the hub (a Kubernetes API emulator), without a restart.

The GlobalProxy and FederatedModel are ``examples/v1alpha2/globalproxy.yaml`` and
``federatedmodel.yaml`` as shipped, but for the members' addresses (``https://127.0.0.1:PORT``) and
the probe interval (200 ms instead of 15 s). The members ("core", "edge-1") are stub engines behind
TLS standing for member proxies: a server certificate from a test CA, and a client certificate
*required* (``ssl.CERT_REQUIRED`` against that CA): a handshake without the Secret's ``tls.crt``
fails. The process gets no ``SSL_CERT_FILE``: the test CA is trusted only through the Secret's
``ca.crt``. The client is the real ``openai`` client.
"""

from __future__ import annotations

import base64
import contextlib
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from tests.harness import LoopThread, free_port, wait_port
from tests.proxy._procs import ROOT, env, stop
from tests.stub_engine import StubEngine
from tests.tls.certs import make_certs, make_client_cert

EXAMPLES = ROOT / "examples" / "v1alpha2"
GPROXIES = "ai.flexinfer/v1alpha2/globalproxies"
FEDERATED = "ai.flexinfer/v1alpha2/federatedmodels"
SECRETS = "v1/secrets"
MODEL = "qwen3-4b"  # the FederatedModel example's name; the stubs list it (as a LoRA adapter id)
MSGS: Any = [{"role": "user", "content": "hi"}]


def b64(p: Path | bytes) -> str:
    return base64.b64encode(p if isinstance(p, bytes) else p.read_bytes()).decode()


def tls_secret(**data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": "global-proxy-tls", "namespace": "default"}, "data": data}


class Hub(LoopThread):
    """The hub's emulator and the two TLS members, on one loop thread."""

    def __init__(self, tmp: Path, server_ctx: ssl.SSLContext) -> None:
        super().__init__()
        from tests.api.helpers import CRDS
        from tests.kube_emulator import start_kube

        self._stack = contextlib.AsyncExitStack()
        self.kube = self.run(self._stack.enter_async_context(start_kube(tmp)))
        for n in ("globalproxies", "federatedmodels"):
            crd = yaml.safe_load((CRDS / f"ai.flexinfer_{n}.yaml").read_text())
            self.call(lambda crd=crd: self.kube.register_crd(crd))
        self.members: list[StubEngine] = []
        for _ in range(2):
            stub = StubEngine()
            stub.lora_adapters = [MODEL]
            self.members.append(self.run(stub.start(ssl=server_ctx)))

    def status(self) -> dict[str, Any]:
        got = self.call(lambda: self.kube.get(GPROXIES, "default", "global"))
        return dict((got or {}).get("status") or {})

    def cond(self, type_: str) -> dict[str, Any]:
        return next((c for c in self.status().get("conditions") or () if c.get("type") == type_), {})

    def posts(self, i: int) -> int:
        return sum(r.method == "POST" for r in self.members[i].requests)

    async def stop_extra(self) -> None:
        for s in self.members:
            await s.stop()
        await self._stack.aclose()


def wait(what: str, cond: Callable[[], object], timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"not reached in {timeout:g}s: {what}"
        time.sleep(0.05)


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[tuple[Hub, Any]]:
    certs = make_certs(tmp_path / "certs")
    ctx = certs.server_context()
    ctx.verify_mode = ssl.CERT_REQUIRED  # a client certificate from the test CA, or no handshake
    ctx.load_verify_locations(certs.ca)
    h = Hub(tmp_path, ctx)
    try:
        yield h, certs
    finally:
        h.close()


def test_members_over_mtls_from_the_secret_without_a_restart(hub: tuple[Hub, Any], tmp_path: Path) -> None:
    h, certs = hub
    client_cert, client_key = make_client_cert(tmp_path / "certs")
    gp = yaml.safe_load((EXAMPLES / "globalproxy.yaml").read_text())
    gp["metadata"]["namespace"] = "default"
    for c, m in zip(gp["spec"]["clusters"], h.members, strict=True):
        c["endpoint"] = f"https://127.0.0.1:{m.port}"
    gp["spec"]["probe"]["interval"] = "200ms"
    fm = yaml.safe_load((EXAMPLES / "federatedmodel.yaml").read_text())
    fm["metadata"]["namespace"] = "default"
    h.call(lambda: (h.kube.seed(GPROXIES, gp), h.kube.seed(FEDERATED, fm)))
    tmpdir = tmp_path / "proc-tmp"
    tmpdir.mkdir()
    port = free_port()
    e = env(KUBECONFIG=str(h.kube.kubeconfig_path), POD_NAMESPACE="default", TMPDIR=str(tmpdir))
    e.pop("SSL_CERT_FILE", None)
    err = tmp_path / "stderr"
    with err.open("wb") as errf:
        proc = subprocess.Popen([sys.executable, "-m", "flexinfer.cli", "--log-level", "info", "proxy", "--global",
                                 "--kube", "--port", str(port)], cwd=ROOT, env=e, stderr=errf)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
    try:
        wait_port(port, timeout=30)
        # -- no Secret: the handshakes fail (no client certificate), the condition says why, and the
        # FederatedModel's model is a 503 in OpenAI JSON (known, no cluster to serve it), not a 404
        wait("TLSReady SecretNotFound", lambda: h.cond("TLSReady").get("reason") == "SecretNotFound")
        assert h.cond("TLSReady")["status"] == "False"
        assert "default/global-proxy-tls not found" in h.cond("TLSReady")["message"]
        wait("Ready NoHealthyCluster", lambda: h.cond("Ready").get("reason") == "NoHealthyCluster")
        with pytest.raises(openai.APIStatusError) as exc:
            client.chat.completions.create(model=MODEL, messages=MSGS)
        assert exc.value.status_code == 503
        body: Any = exc.value.body
        assert isinstance(body, dict) and body.get("type") and body.get("message"), body
        assert h.posts(0) == h.posts(1) == 0

        # -- a Secret with bad PEM: InvalidCertificate, nothing crashes, still 503
        h.call(lambda: h.kube.seed(SECRETS, tls_secret(**{"tls.crt": b64(b"not a certificate"),
                                                           "tls.key": b64(client_key), "ca.crt": b64(certs.ca)})))
        wait("TLSReady InvalidCertificate", lambda: h.cond("TLSReady").get("reason") == "InvalidCertificate")
        assert "BEGIN" not in h.cond("TLSReady")["message"]  # never PEM text in a message
        with pytest.raises(openai.APIStatusError) as exc:
            client.chat.completions.create(model=MODEL, messages=MSGS)
        assert exc.value.status_code == 503

        # -- the Secret fixed: taken at the next sync, both members healthy, requests succeed (Failover: core)
        good = tls_secret(**{"tls.crt": b64(client_cert), "tls.key": b64(client_key), "ca.crt": b64(certs.ca)})
        h.run(h.kube.upsert(SECRETS, good))
        wait("TLSReady True", lambda: h.cond("TLSReady").get("status") == "True")
        assert h.cond("TLSReady")["reason"] == "SecretLoaded"
        wait("2 healthy clusters", lambda: h.status().get("healthyClusters") == 2)
        assert h.status()["activeCluster"] == "core"
        for _ in range(3):
            out = client.chat.completions.create(model=MODEL, messages=MSGS)
            assert out.choices[0].message.content == "hello from stub"
        assert (h.posts(0), h.posts(1)) == (3, 0)
        files = [p for p in tmpdir.rglob("*") if p.is_file()]
        assert sorted(p.name for p in files) == ["ca.crt", "tls.crt", "tls.key"]
        assert {oct(p.stat().st_mode & 0o777) for p in files} == {"0o600"}
        assert all(oct(p.stat().st_mode & 0o777) == "0o700" for p in tmpdir.rglob("*") if p.is_dir())

        # -- broken again: the last good material stays in use; the condition says both
        h.run(h.kube.upsert(SECRETS, tls_secret(**{"tls.crt": b64(client_cert)})))
        wait("TLSReady InvalidCertificate again", lambda: h.cond("TLSReady").get("reason") == "InvalidCertificate")
        assert "last good TLS material stays" in h.cond("TLSReady")["message"]
        out = client.chat.completions.create(model=MODEL, messages=MSGS)
        assert out.choices[0].message.content == "hello from stub" and h.posts(0) == 4
    finally:
        client.close()
        stop(proc)
    assert proc.returncode == 0, err.read_text()
    text = err.read_text()
    assert "Traceback" not in text and "PRIVATE KEY" not in text, text
    assert not any(tmpdir.iterdir()), list(tmpdir.rglob("*"))  # the key files are removed on stop
    assert os.path.isdir(tmpdir)


def test_file_mode_takes_tls_files(hub: tuple[Hub, Any], tmp_path: Path) -> None:
    """``--global FILE`` with ``--global-tls-ca/-cert/-key``: the same mTLS members, served; a key that
    does not match its certificate is refused at the start with the reason (exit 2)."""
    h, certs = hub
    client_cert, client_key = make_client_cert(tmp_path / "certs")
    gp = yaml.safe_load((EXAMPLES / "globalproxy.yaml").read_text())
    for c, m in zip(gp["spec"]["clusters"], h.members, strict=True):
        c["endpoint"] = f"https://127.0.0.1:{m.port}"
    gp["spec"]["probe"]["interval"] = "200ms"
    del gp["spec"]["tls"]
    path = tmp_path / "global.yaml"
    path.write_text(yaml.safe_dump(gp))
    base = [sys.executable, "-m", "flexinfer.cli", "--log-level", "warning", "proxy", "--global", str(path)]
    tls = ["--global-tls-ca", str(certs.ca), "--global-tls-cert", str(client_cert)]
    bad = subprocess.run([*base, *tls, "--global-tls-key", str(certs.key)], cwd=ROOT, env=env(),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--global-tls-*" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    port = free_port()
    proc = subprocess.Popen([*base, *tls, "--global-tls-key", str(client_key), "--port", str(port)], cwd=ROOT,
                            env=env())
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
    try:
        wait_port(port, timeout=30)
        wait("the members' models", lambda: "stub" in [m.id for m in client.models.list()])
        out = client.chat.completions.create(model="stub", messages=MSGS)
        assert out.choices[0].message.content == "hello from stub" and h.posts(0) == 1
    finally:
        client.close()
        stop(proc)
    assert proc.returncode == 0
