"""RequestTask (flexinfer/http/task.py) does for a request's handler what asyncio.Task does: each case
runs the same coroutine under both and compares what the coroutine saw, on uvloop and on asyncio,
in the build and in the source (the pure run of the suite)."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from flexinfer.http import task as task_mod
from flexinfer.http.task import RequestTask
from tests.http._support import RecordingHandler, exchange, serve

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("test_task_var", default="unset")

Make = Callable[[Coroutine[Any, Any, None]], Any]


def _request_task(coro: Coroutine[Any, Any, None]) -> RequestTask:
    return RequestTask(coro, asyncio.get_running_loop(), "test")


def _asyncio_task(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    return asyncio.get_running_loop().create_task(coro)


KINDS = [pytest.param(_request_task, id="RequestTask"), pytest.param(_asyncio_task, id="asyncio.Task")]


async def _until(cond: Callable[[], object], turns: int = 200) -> None:
    for _ in range(turns):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


async def _until_timer(cond: Callable[[], object], seconds: float = 5.0) -> None:
    """``cond`` reached once a timer fired: bounded by the clock, not by loop turns (uvloop on a quiet
    machine turns 10,000 times in less than a 10 ms timer)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while not cond():
        if loop.time() > end:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("make", KINDS)
async def test_runs_from_the_next_turn_through_futures_and_bare_yields(make: Make) -> None:
    loop = asyncio.get_running_loop()
    seen: list[object] = []
    f1, f2 = loop.create_future(), loop.create_future()

    async def body() -> None:
        seen.append("start")
        seen.append(await f1)
        await asyncio.sleep(0)
        seen.append("after sleep(0)")
        try:
            await f2
        except ValueError as e:
            seen.append(f"raised {e}")

    t = make(body())
    assert seen == [] and not t.done()  # not started inside the call
    await asyncio.sleep(0)
    assert seen == ["start"]
    f1.set_result(1)
    await _until(lambda: len(seen) == 3)
    f2.set_exception(ValueError("boom"))
    await _until(t.done)
    assert seen == ["start", 1, "after sleep(0)", "raised boom"]
    assert not t.cancelled()


@pytest.mark.parametrize("make", KINDS)
async def test_is_the_current_task_and_timeout_works_inside(make: Make) -> None:
    loop = asyncio.get_running_loop()
    seen: list[object] = []

    async def body() -> None:
        me = asyncio.current_task()
        seen.append(me is not None)
        try:
            async with asyncio.timeout(0.01):
                await loop.create_future()  # never done
        except TimeoutError:
            seen.append("timeout")
        seen.append(asyncio.current_task() is me)
        seen.append(me.cancelling() if me is not None else None)  # the timeout's cancel was undone

    before = asyncio.current_task()
    t = make(body())
    await _until_timer(t.done)
    assert seen == [True, "timeout", True, 0]
    assert asyncio.current_task() is before  # left as it was found
    assert not t.cancelled()


@pytest.mark.parametrize("make", KINDS)
async def test_cancel_while_waiting_raises_at_the_await(make: Make) -> None:
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    seen: list[object] = []

    async def body() -> None:
        try:
            await fut
        except asyncio.CancelledError:
            seen.append(("cancelled", asyncio.current_task().cancelling()))  # type: ignore[union-attr]
            raise

    t = make(body())
    await asyncio.sleep(0)
    assert t.cancel() is True
    assert fut.cancelled()  # the awaited future is cancelled, as Task.cancel does
    await _until(t.done)
    assert seen == [("cancelled", 1)]
    assert t.cancelled() and t.cancelling() == 1
    assert t.cancel() is False  # done: nothing to cancel


@pytest.mark.parametrize("make", KINDS)
async def test_cancel_before_the_first_step_never_runs_the_body(make: Make) -> None:
    seen: list[str] = []

    async def body() -> None:
        seen.append("ran")

    t = make(body())
    assert t.cancel() is True
    await _until(t.done)
    assert seen == [] and t.cancelled()


@pytest.mark.parametrize("make", KINDS)
async def test_cancel_after_the_future_is_done_raises_at_the_next_step(make: Make) -> None:
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    seen: list[object] = []

    async def body() -> None:
        try:
            await fut
            seen.append("resumed")
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            seen.append("cancelled")
            return  # caught and finished: done, not cancelled

    t = make(body())
    await asyncio.sleep(0)
    fut.set_result(None)  # the wakeup is scheduled; the cancel comes before it runs
    assert t.cancel() is True
    await _until(t.done)
    assert seen == ["cancelled"]
    assert not t.cancelled()


@pytest.mark.parametrize("make", KINDS)
async def test_shield_and_uncancel_inside(make: Make) -> None:
    loop = asyncio.get_running_loop()
    inner = loop.create_future()
    seen: list[object] = []

    async def body() -> None:
        me = asyncio.current_task()
        assert me is not None
        try:
            await asyncio.shield(inner)
        except asyncio.CancelledError:
            seen.append(("shielded", inner.cancelled(), me.cancelling()))
            seen.append(me.uncancel())
        seen.append(await inner)

    t = make(body())
    await asyncio.sleep(0)
    t.cancel()
    await _until(lambda: len(seen) == 2)
    inner.set_result("inner result")
    await _until(t.done)
    assert seen == [("shielded", False, 1), 0, "inner result"]
    assert not t.cancelled()


@pytest.mark.parametrize("make", KINDS)
async def test_context_is_the_request_s_own(make: Make) -> None:
    loop = asyncio.get_running_loop()
    futs = [loop.create_future() for _ in range(2)]
    seen: list[tuple[str, str]] = []

    def body(name: str, fut: asyncio.Future[None]) -> Coroutine[Any, Any, None]:
        async def run() -> None:
            seen.append((name, VAR.get()))
            VAR.set(name)
            await fut
            seen.append((name, VAR.get()))
            await asyncio.sleep(0)
            seen.append((name, VAR.get()))
        return run()

    VAR.set("outside")
    ta, tb = make(body("a", futs[0])), make(body("b", futs[1]))
    await asyncio.sleep(0)
    futs[1].set_result(None)
    futs[0].set_result(None)
    await _until(lambda: ta.done() and tb.done())
    assert sorted(seen) == sorted([("a", "outside"), ("b", "outside"), ("a", "a"), ("b", "b"),
                                   ("a", "a"), ("b", "b")])
    assert VAR.get() == "outside"  # nothing leaked out


@pytest.mark.parametrize("make", KINDS)
async def test_a_token_from_one_step_resets_the_variable_in_a_later_one(make: Make) -> None:
    """All steps share one context (the tracing sets its span in one step and resets it later)."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    seen: list[str] = []

    async def body() -> None:
        token = VAR.set("inside")
        await fut
        VAR.reset(token)  # ValueError if this step ran in another context than the set
        seen.append(VAR.get())

    VAR.set("outside")
    t = make(body())
    await asyncio.sleep(0)
    fut.set_result(None)
    await _until(t.done)
    assert seen == ["outside"]


@pytest.mark.parametrize("make", KINDS)
async def test_a_bad_yield_is_thrown_back_into_the_coroutine(make: Make) -> None:
    seen: list[str] = []

    class Bad:
        def __await__(self) -> Any:
            yield "not a future"

    async def body() -> None:
        try:
            await Bad()
        except RuntimeError as e:
            seen.append(str(e).split(":")[0])

    t = make(body())
    await _until(t.done)
    assert seen == ["Task got bad yield"]


async def test_an_escaping_base_exception_goes_to_the_loop_s_handler() -> None:
    loop = asyncio.get_running_loop()
    got: list[dict[str, Any]] = []
    old = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: got.append(ctx))

    class Odd(BaseException):
        pass

    async def body() -> None:
        await asyncio.sleep(0)
        raise Odd("escaped")

    try:
        live0 = task_mod.live()
        t = _request_task(body())
        assert task_mod.live() == live0 + 1
        await _until(t.done)
    finally:
        loop.set_exception_handler(old)
    assert [type(c["exception"]) for c in got] == [Odd] and got[0]["task"] is t
    assert task_mod.live() == live0


class _Arg:
    """The hook's argument (weak-referenceable: the test sees it freed)."""


@pytest.mark.parametrize("ending", ["return", "raise", "cancel"])
async def test_the_end_hook_hears_how_the_coroutine_ended_inside_its_last_step(ending: str) -> None:
    """``on_end(arg, exc)`` runs once, in the last step: the task still current and not done, the
    request's context in force, the live count not yet decremented; then the task ends (cancelled
    for a cancellation), the loop's exception handler hears nothing, and the hook and its argument
    are let go (freed by reference counting)."""
    loop = asyncio.get_running_loop()
    handled: list[dict[str, Any]] = []
    old = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: handled.append(ctx))
    fut = loop.create_future()
    heard: list[tuple[Any, ...]] = []

    async def body() -> None:
        VAR.set("inside")
        await fut
        if ending == "raise":
            raise ValueError("boom")

    def on_end(arg: _Arg, exc: BaseException | None) -> None:
        heard.append((type(arg), type(exc), asyncio.current_task() is t, t.done(), VAR.get(), task_mod.live() - live0))

    arg = _Arg()
    ref = weakref.ref(arg)
    live0 = task_mod.live()
    gc.disable()
    try:
        t = RequestTask(body(), loop, "test", on_end, arg)
        del arg
        await asyncio.sleep(0)
        if ending == "cancel":
            t.cancel()
        else:
            fut.set_result(None)
        await _until(t.done)
        assert ref() is None  # the task dropped its hook's argument when it ended: no cycle, no collector
    finally:
        gc.enable()
        loop.set_exception_handler(old)
    expected = {"return": type(None), "raise": ValueError, "cancel": asyncio.CancelledError}[ending]
    assert heard == [(_Arg, expected, True, False, "inside", 1)]
    assert t.cancelled() is (ending == "cancel") and task_mod.live() == live0
    assert handled == [] and VAR.get() == "unset"


async def test_a_failing_end_hook_goes_to_the_loop_s_handler_and_the_task_still_ends() -> None:
    loop = asyncio.get_running_loop()
    got: list[dict[str, Any]] = []
    old = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: got.append(ctx))

    def on_end(arg: object, exc: BaseException | None) -> None:
        raise KeyError(arg)

    async def body() -> None:
        await asyncio.sleep(0)

    live0 = task_mod.live()
    try:
        t = RequestTask(body(), loop, "test", on_end, "the-arg")
        await _until(t.done)
    finally:
        loop.set_exception_handler(old)
    assert [(type(c["exception"]), c["exception"].args, c["task"] is t) for c in got] == [(KeyError, ("the-arg",), True)]
    assert not t.cancelled() and task_mod.live() == live0


async def test_live_counts_unfinished_tasks_and_a_finished_one_is_freed_without_the_collector() -> None:
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    async def body() -> None:
        await fut

    live0 = task_mod.live()
    gc.disable()
    try:
        coro = body()
        ref = weakref.ref(coro)
        t = _request_task(coro)
        del coro
        assert task_mod.live() == live0 + 1
        await asyncio.sleep(0)
        fut.set_result(None)
        await _until(t.done)
        assert task_mod.live() == live0
        assert ref() is not None  # the task still holds its coroutine
        del t
        assert ref() is None  # no cycle left behind: freed by reference counting
    finally:
        gc.enable()


async def test_the_protocol_runs_handlers_in_request_tasks() -> None:
    """A request's handler runs in a RequestTask that is the current task inside it."""
    seen: list[object] = []

    class Handler(RecordingHandler):
        async def handle(self, req: Any, w: Any) -> None:
            me = asyncio.current_task()
            seen.append((type(me).__name__, me is w.task))
            await asyncio.sleep(0)
            w.send(200, [(b"content-type", b"text/plain")], b"ok")

    async with serve(Handler()) as server:
        got = await exchange(server.port, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert got.data.startswith(b"HTTP/1.1 200") and got.data.endswith(b"ok")
    assert seen == [("RequestTask", True)]


async def test_the_enter_task_path_where_current_task_does_not_read_the_dict(monkeypatch: pytest.MonkeyPatch,
                                                                             ) -> None:
    """Where ``asyncio.current_task()`` does not read ``asyncio.tasks._current_tasks`` (CPython
    3.14's per-thread task), a step enters and leaves through asyncio's ``_enter_task`` and
    ``_leave_task``. Only the source can be switched (the build's flag is a C global): the pure run
    of the suite covers it."""
    if not hasattr(task_mod, "_BY_DICT"):
        pytest.skip("the build's switch is a C global; the source run checks this path")
    calls: list[str] = []
    enter, leave = task_mod._enter_task, task_mod._leave_task

    def spy_enter(loop: Any, t: Any) -> None:
        calls.append("enter")
        enter(loop, t)

    def spy_leave(loop: Any, t: Any) -> None:
        calls.append("leave")
        leave(loop, t)

    monkeypatch.setattr(task_mod, "_BY_DICT", False)
    monkeypatch.setattr(task_mod, "_enter_task", spy_enter)
    monkeypatch.setattr(task_mod, "_leave_task", spy_leave)
    seen: list[object] = []

    async def body() -> None:
        seen.append(isinstance(asyncio.current_task(), RequestTask))
        try:
            async with asyncio.timeout(0.01):
                await asyncio.get_running_loop().create_future()
        except TimeoutError:
            seen.append("timeout")

    t = _request_task(body())
    await _until_timer(t.done)
    assert seen == [True, "timeout"]
    assert calls and calls == ["enter", "leave"] * (len(calls) // 2)


def test_current_task_reads_the_dict_on_this_python() -> None:
    """On CPython 3.11-3.13 the step takes the dict's path (the cheaper one); the build decides the
    same way at import, from the same probe."""
    import sys

    if not hasattr(task_mod, "_BY_DICT"):
        pytest.skip("the build's switch is a C global; the source run checks the probe")
    if sys.version_info >= (3, 14):
        pytest.skip("CPython 3.14 keeps the current task per thread")
    assert task_mod._BY_DICT is True
