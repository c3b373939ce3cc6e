"""``peers:`` in serve's config (docs/tls.md): typed (unknown keys refused with a suggestion),
``${env.NAME}`` in the API key, URL rules, and model names unique against local models and peers."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexinfer.runtime.configfile import InventoryConfigError
from flexinfer.runtime.localconfig import check_local_config, load_peers
from flexinfer.runtime.peers import PeeredInventory, peer_views, split_url

LOCAL = "models:\n  - name: here\n    cmd: ${PYTHON} -m tests.stub_engine --port ${PORT}\n"


def write(tmp: Path, peers: str) -> str:
    p = tmp / "local.yaml"
    p.write_text(LOCAL + "peers:\n" + peers)
    return str(p)


def problems(path: str) -> str:
    with pytest.raises(InventoryConfigError) as ei:
        load_peers(path)
    return "\n".join(ei.value.problems)


def test_peer_views_with_env_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OR_KEY", "sk-or")
    path = write(tmp_path, "  openrouter:\n    proxy: https://openrouter.ai/api/\n    api_key: ${env.OR_KEY}\n"
                           "    models: [a/b, c]\n")
    [peer] = load_peers(path)
    assert (peer.name, peer.proxy, peer.models, peer.api_key) == ("openrouter", "https://openrouter.ai/api/",
                                                                  ("a/b", "c"), "sk-or")
    assert "sk-or" not in repr(peer)
    views = peer_views([peer])
    assert [v.name for v in views] == ["a/b", "c"]
    ep = views[0].endpoints[0]
    assert (ep.host, ep.port, ep.scheme) == ("openrouter.ai", 443, "https")
    assert ep.link is not None and (ep.link.api_key, ep.link.path_prefix) == ("sk-or", "/api")
    assert views[0].ready and views[0].owned_by == "peer:openrouter"

    class Inner:
        def resolve(self, name: str) -> None:
            return None

        def models(self) -> list[object]:
            return []

        def subscribe(self, cb: object) -> None:
            pass

    inv = PeeredInventory(Inner(), views)  # type: ignore[arg-type]
    assert inv.resolve("c") is views[1] and inv.resolve("nope") is None
    assert [v.name for v in inv.models()] == ["a/b", "c"]


def test_peer_mistakes_are_errors_with_their_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOPE_KEY", raising=False)
    path = write(tmp_path, "  p1:\n    proxy: ftp://x\n    models: [m]\n"
                           "  p2:\n    proxy: https://h\n    api_kye: x\n    models: [m]\n"
                           "  p3:\n    proxy: https://h\n    api_key: ${env.NOPE_KEY}\n    models: [here, m]\n")
    text = problems(path)
    assert "peers.p1.proxy" in text and "https:// or http://" in text
    assert "api_kye" in text and "api_key" in text  # the closest known key suggested
    assert "NOPE_KEY" in text
    assert "peers.p3.models[0]" in text and "'here' is also served by a local model" in text
    assert check_local_config(path)  # serve --check reports them too


def test_split_url() -> None:
    assert split_url("https://h:8443") == ("https://h:8443", "")
    assert split_url("http://h:1/v1/") == ("http://h:1", "/v1")
    for bad in ("https://h/x?y=1", "h:1", "https://:1"):
        with pytest.raises(ValueError):
            split_url(bad)
