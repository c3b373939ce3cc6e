# The declarations of bodyframe_c's body readers, for a module that cimports them: the compiled
# upstream connection (flexinfer/http/client.pxd) holds its body reader as a BodyFrame and calls
# feed per read as a C method, reading done and extra as C fields (a call and two lookups by name
# per read otherwise). The .pyx has the code; bodyframe_py the pure twin (BodyFrame there too).

cdef class BodyFrame:
    cdef public bint done
    cdef public Py_ssize_t extra
    cpdef bytes feed(self, bytes data)

cdef class ChunkedBody(BodyFrame):
    cdef public Py_ssize_t max_line
    cdef public unsigned long long left
    cdef int _state
    cdef Py_ssize_t _line

cdef class LengthBody(BodyFrame):
    cdef public Py_ssize_t left
