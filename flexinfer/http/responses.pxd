# The compiled build of responses.py: the status line of every response as a cpdef function (a C
# call from request.pxd's cimport, the same function from Python). The .py is the pure twin; it says
# @cython.annotation_typing(False) (its int annotation, flexinfer/_nocython.py).
cimport cython

@cython.locals(lines=dict)
cpdef bytes status_line(status)
