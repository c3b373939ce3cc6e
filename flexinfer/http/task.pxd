# The compiled build of task.py: RequestTask as an extension type (its state in C slots; its own
# calls C calls). The .py is the pure twin; slots are public, so visibility is the source's. Keep
# the list equal to the class's __slots__ (tests/test_compiled.py).
# _send_c: what task.py's _send does, with CPython's PyIter_Send, which reports a return without
# raising StopIteration (catching it cost about 1k instructions per request: a traceback entry and
# the exception fetched for the handler).
from cpython.object cimport PyObject
from cpython.ref cimport Py_XDECREF

cdef extern from "Python.h":
    # PYGEN_ERROR (-1): an exception is set; PYGEN_RETURN (0): returned; PYGEN_NEXT (1): yielded
    int PyIter_Send(object iter, object arg, PyObject **presult) except -1


cdef dict _current
cdef list _live
cdef bint _BY_DICT
cdef object _DONE

cdef inline object _send_c(object coro):
    cdef PyObject *res = NULL
    cdef int r = PyIter_Send(coro, None, &res)
    value = <object>res
    Py_XDECREF(res)
    return value if r == 1 else _DONE

cdef class RequestTask:
    cdef public object _cancelled, _cancels, _context, _coro, _done, _loop, _must_cancel, _on_end, _on_end_arg, _waiter, name
    cpdef _step(self, exc=*)
    cpdef _yielded(self, result)
    cpdef _ended(self, exc, cancelled)
    cpdef _finish(self, cancelled)
