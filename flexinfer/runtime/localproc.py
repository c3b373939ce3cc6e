"""Process helpers of the local runtime for the per-model options: ``check_endpoint: none`` and ``cmd_stop``.

Owns: :func:`port_accepts` (the readiness of a model whose health probe is off: its port accepts a
TCP connection) and :func:`stop_by_command` (a model's ``cmd_stop``, e.g. ``docker stop ${NAME}``:
run with the model's environment, its output appended to the model's log, bounded by
``stop_timeout``; then the model's own process is waited for within what is left of that bound).
Must not: decide when a model starts or stops, or signal the model's process (the caller,
:class:`flexinfer.runtime.local.LocalRuntime`, sends the usual SIGTERM/SIGKILL afterwards when the
process is still there).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Mapping, MutableSequence

from flexinfer.runtime.localconfig import LocalModelSpec

log = logging.getLogger("flexinfer.local")

OUTPUT_LINES = 20  # the last lines of cmd_stop's output kept in the model's log


async def port_accepts(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when ``host:port`` accepts a TCP connection (closed at once)."""
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return True


async def stop_by_command(spec: LocalModelSpec, port: int, proc: asyncio.subprocess.Process,
                          env: Mapping[str, str], logs: MutableSequence[str]) -> bool:
    """Run ``spec.stop_command`` for the model process ``proc`` (``${PID}`` is its pid) and wait,
    ``spec.stop_timeout`` in all, for that process to exit. True when it did; False leaves it to the
    caller's signals (the stop command failed, hung, or did not make the process exit)."""
    argv = spec.render(port, spec.stop_command, proc.pid)
    bound = spec.stop_timeout
    end = time.monotonic() + bound
    logs.append(f"[flexinfer] cmd_stop {spec.name}: {' '.join(argv)}")
    try:
        stopper = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env={**os.environ, **env},
            stdin=asyncio.subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        logs.append(f"[flexinfer] cmd_stop cannot run {argv[0]!r}: {exc.strerror}")
        log.warning("%s: cmd_stop cannot run %r: %s", spec.name, argv[0], exc.strerror)
        return False
    try:
        out, _ = await asyncio.wait_for(stopper.communicate(), bound)
    except TimeoutError:
        logs.append(f"[flexinfer] cmd_stop did not finish within stop_timeout ({bound:g}s): killed")
        log.warning("%s: cmd_stop did not finish within %gs: killed, stopping the process with signals",
                    spec.name, bound)
        return False
    finally:
        if stopper.returncode is None:  # timed out or cancelled: the stop command goes too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(stopper.pid, signal.SIGKILL)
            await stopper.wait()
    logs.extend(out.decode("utf-8", "replace").splitlines()[-OUTPUT_LINES:])
    logs.append(f"[flexinfer] cmd_stop exited with code {stopper.returncode}")
    if stopper.returncode != 0:
        log.warning("%s: cmd_stop exited with code %s", spec.name, stopper.returncode)
    try:
        await asyncio.wait_for(proc.wait(), max(0.0, end - time.monotonic()))
    except TimeoutError:
        logs.append("[flexinfer] the process is still running after cmd_stop: signalling it")
        return False
    return True
