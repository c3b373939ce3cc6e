"""``flexinfer proxy --kube`` as a process: kubeconfig from KUBECONFIG, namespace from POD_NAMESPACE."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import aiohttp

from tests.runtime.kube.conftest import MODELS, KubeStack, model_obj, proxy_process


async def test_proxy_kube_process_lists_models_and_exits_cleanly(ks: KubeStack) -> None:
    await ks.put(MODELS, model_obj("m", ns="team"))
    await ks.put(MODELS, model_obj("elsewhere", ns="default"))
    async with proxy_process(ks.kube.kubeconfig_path, "team") as (proc, port):
        ids: list[str] = []
        end = time.monotonic() + 20
        async with aiohttp.ClientSession() as s:
            while time.monotonic() < end and ids != ["m"]:
                try:
                    async with s.get(f"http://127.0.0.1:{port}/v1/models") as r:
                        ids = [d["id"] for d in json.loads(await r.read())["data"]]
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        assert ids == ["m"]  # only its own namespace
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
        assert proc.stderr is not None
        err = (await proc.stderr.read()).decode()
        assert "Traceback" not in err and "failed" not in err, err
