"""The task that runs one request's handler: asyncio.Task's behaviour, without its registration.

Owns: :class:`RequestTask`, which drives the coroutine ``HttpProtocol`` makes for each request as
:class:`asyncio.Task` would (first step on the next loop turn, one step per completed future, the
handler's own context, cancellation, ``asyncio.current_task()`` inside it, so ``asyncio.timeout``,
``asyncio.shield`` and ``Task.cancelling()`` work as they do in a Task), and :func:`live`, how many
are unfinished.

Why not asyncio.Task (issue 15): on CPython 3.11 each Task registers in ``asyncio.tasks._all_tasks``,
a ``weakref.WeakSet`` whose ``add`` and ``_remove`` run as Python code (replacing the Task by this
class, with the Task's name and its other bookkeeping, took a plain request from 136.9k to 132.3k
instructions, ``bench/instr.py``: the saving net of this class's own cost); and a
request task is never awaited, gathered or listed: the writer holds it to cancel it, and nothing
else. The build also resumes the coroutine with ``PyIter_Send``, as the C Task does (task.pxd).
What it leaves out, on purpose: ``asyncio.all_tasks()`` does not list it (:func:`live` counts it,
and the leak tests read that); it has no result, exception or done callbacks (nobody awaits it).
In their place, one hook: ``on_end(on_end_arg, exc)`` hears how the coroutine ended, ``None`` for a
return, else the CancelledError or Exception it raised, inside the last step (the request's context,
the task current), before the task counts as done. The protocol answers or aborts the request
there, which saves it a coroutine of its own around the handler's (one coroutine fewer per request,
about 1k instructions: issue 15). What else escapes (without a hook, or the hook's own failure) goes
to the loop's exception handler at once, where a Task would keep it until it is garbage collected;
KeyboardInterrupt and SystemExit propagate, as from a Task.

Context: as a Task, it copies the context it is made in and runs every step in that one copy
(``call_soon`` and ``add_done_callback`` with ``context=``): what the handler sets in a ContextVar
stays inside the request and a token from one step resets the variable in a later one (the
tracing's span, flexinfer/proxy/tracing.py).

Must not: run a step before the loop's next turn (measured twice: with an asyncio Task, starting
the handler inside the read cost more than it saved; with this class, 2026-12-05, it saved 1.3 % of
a request's instructions and nothing measurable under load; docs/first-event.md), or swallow a
cancellation.
"""

from __future__ import annotations

import asyncio
import contextvars
from asyncio import tasks as _tasks
from collections.abc import Callable, Coroutine
from typing import Any

try:
    import cython
except ImportError:  # no Cython here: its decorators do nothing in pure Python
    from flexinfer import _nocython as cython  # type: ignore[no-redef]

__all__ = ["RequestTask", "live"]

_CancelledError = asyncio.CancelledError
_copy_context = contextvars.copy_context
#: What makes a step's task ``asyncio.current_task()`` and ends that: asyncio's ``_enter_task`` and
#: ``_leave_task`` (each refuses to enter while another task runs on the loop, or to leave one that is
#: not current), or, where ``current_task()`` reads the dict ``asyncio.tasks._current_tasks`` (C
#: ``_asyncio`` of CPython 3.11-3.13, checked below), that dict's own operations: two C calls fewer a
#: step (about 1k instructions a plain request, ``bench/instr.py``).
_enter_task = _tasks._enter_task
_leave_task = _tasks._leave_task
_current: dict[Any, Any] = getattr(_tasks, "_current_tasks", {})


def _reads_the_dict() -> bool:
    key, mark = object(), object()  # a stand-in loop and task
    _current[key] = mark
    try:
        return asyncio.current_task(key) is mark  # type: ignore[arg-type]
    except Exception:  # pragma: no cover - a Python whose current_task() takes no stand-in
        return False
    finally:
        del _current[key]


_BY_DICT = _reads_the_dict()

#: Request tasks made and not finished (leak tests read it through live()).
_live: list[int] = [0]


#: What _send and _throw return when the coroutine returned (its value, always None here, is dropped).
_DONE: Any = object()


def _send(coro: Coroutine[Any, Any, None]) -> Any:
    """Resume ``coro``: what it yields next, or _DONE. (The build sends with ``PyIter_Send``, which
    reports the return without raising StopIteration: task.pxd's ``_send_c``.)"""
    try:
        return coro.send(None)
    except StopIteration:
        return _DONE


def _throw(coro: Coroutine[Any, Any, None], exc: BaseException) -> Any:
    """Throw ``exc`` into ``coro``: what it yields next, or _DONE; what it raises propagates."""
    try:
        return coro.throw(exc)
    except StopIteration:
        return _DONE


def live() -> int:
    """How many request tasks are unfinished (made, not yet returned or cancelled)."""
    return _live[0]


class RequestTask:
    """Runs ``coro`` on ``loop`` as asyncio.Task would, from the next turn on (see the module)."""

    __slots__ = ("_cancelled", "_cancels", "_context", "_coro", "_done", "_loop", "_must_cancel", "_on_end",
                 "_on_end_arg", "_waiter", "name")

    def __init__(self, coro: Coroutine[Any, Any, None], loop: asyncio.AbstractEventLoop, name: str,
                 on_end: Callable[[Any, BaseException | None], None] | None = None, on_end_arg: Any = None) -> None:
        self._coro = coro
        self._on_end = on_end  # on_end(on_end_arg, exc): how the coroutine ended (the module says)
        self._on_end_arg = on_end_arg
        self._loop = loop
        self.name = name
        self._waiter: Any = None  # the future the coroutine waits on
        self._done = False
        self._cancelled = False
        self._must_cancel = False
        self._cancels = 0  # cancel() calls not yet matched by uncancel() (Task.cancelling())
        self._context = _copy_context()  # the request's own: every step runs in it
        _live[0] += 1
        loop.call_soon(self._step, context=self._context)

    def __repr__(self) -> str:
        state = "cancelled" if self._cancelled else ("done" if self._done else "pending")
        return f"<RequestTask {self.name} {state} coro={self._coro!r}>"

    # ---- the Task surface the request path uses ------------------------------------------------
    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def get_name(self) -> str:
        return self.name

    def get_coro(self) -> Coroutine[Any, Any, None]:
        return self._coro

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        return self._cancelled

    def cancelling(self) -> int:
        return self._cancels

    def uncancel(self) -> int:
        if self._cancels > 0:
            self._cancels -= 1
        return self._cancels

    def cancel(self, msg: Any = None) -> bool:
        """As Task.cancel: cancel the awaited future, or throw CancelledError in at the next step."""
        if self._done:
            return False
        self._cancels += 1
        waiter = self._waiter
        if waiter is not None and waiter.cancel(msg=msg):
            return True  # its callback wakes the step, where the await raises CancelledError
        self._must_cancel = True
        return True

    # ---- stepping ------------------------------------------------------------------------------
    def _wakeup(self, fut: Any) -> None:
        # the coroutine's own await reads the future's result or raises its exception
        self._step()

    @cython.annotation_typing(False)  # the cpdef of task.pxd
    def _step(self, exc: BaseException | None = None) -> None:
        if self._done:  # pragma: no cover - defensive: a callback after the end
            return
        if self._must_cancel:
            self._must_cancel = False
            if not isinstance(exc, _CancelledError):
                exc = _CancelledError()
        self._waiter = None
        loop = self._loop
        current = _current
        if not _BY_DICT:
            _enter_task(loop, self)  # type: ignore[arg-type]  # a Task in all it is asked for
        elif current.setdefault(loop, self) is not self:  # what _enter_task refuses
            raise RuntimeError(f"Cannot enter into task {self!r} while another task "
                               f"{current[loop]!r} is being executed.")
        try:
            if exc is not None:
                result = _throw(self._coro, exc)
            elif cython.compiled:
                result = _send_c(self._coro)  # type: ignore[name-defined]  # noqa: F821 (task.pxd)
            else:
                result = _send(self._coro)
        except _CancelledError as e:
            self._ended(e, True)
        except (KeyboardInterrupt, SystemExit):
            self._finish(False)
            raise
        except Exception as e:
            self._ended(e, False)
        except BaseException as e:
            self._finish(False)
            self._report(e)
        else:
            if result is _DONE:
                self._ended(None, False)
            else:
                self._yielded(result)
        finally:
            if _BY_DICT:
                del current[loop]
            else:
                _leave_task(loop, self)  # type: ignore[arg-type]

    def _yielded(self, result: Any) -> None:
        """What the coroutine yielded: a future to wait on, or None for a bare yield (sleep(0))."""
        if result is None:
            self._loop.call_soon(self._step, context=self._context)
            return
        blocking = getattr(result, "_asyncio_future_blocking", None)
        if blocking:
            result._asyncio_future_blocking = False
            result.add_done_callback(self._wakeup, context=self._context)
            self._waiter = result
            if self._must_cancel and result.cancel():
                self._must_cancel = False
            return
        if blocking is None:
            err = RuntimeError(f"Task got bad yield: {result!r}")
        else:
            err = RuntimeError(f"yield was used instead of yield from in task {self!r} with {result!r}")
        self._loop.call_soon(self._step, err, context=self._context)

    @cython.annotation_typing(False)  # the cpdef of task.pxd
    def _ended(self, exc: BaseException | None, cancelled: bool) -> None:
        """The coroutine returned (``exc`` None) or raised ``exc``: the hook hears it (still inside the
        step), then the task ends."""
        on_end = self._on_end
        if on_end is None:
            self._finish(cancelled)
            if exc is not None and not cancelled:
                self._report(exc)
            return
        arg = self._on_end_arg
        self._on_end = self._on_end_arg = None  # once; and no cycle through the hook's argument
        try:
            on_end(arg, exc)
        except (KeyboardInterrupt, SystemExit):
            self._finish(cancelled)
            raise
        except BaseException as e:
            self._finish(cancelled)
            self._report(e)
            return
        self._finish(cancelled)

    def _report(self, exc: BaseException) -> None:
        """What escaped the coroutine or its hook, to the loop's exception handler (as a Task's would
        be when collected)."""
        self._loop.call_exception_handler({"message": "request task failed", "exception": exc, "task": self})

    @cython.annotation_typing(False)  # the cpdef of task.pxd
    def _finish(self, cancelled: bool) -> None:
        self._done = True
        self._cancelled = cancelled
        self._waiter = None
        _live[0] -= 1
