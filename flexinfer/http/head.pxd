# The compiled build of head.py: the request-head checks as cpdef functions (C calls from
# protocol.pxd's cimports, the same functions from Python). The .py is the pure twin; it says
# @cython.annotation_typing(False) where Cython would not match its int and list[...] annotations
# with these declarations (flexinfer/_nocython.py); cython.locals types what its annotations typed.
cimport cython

cpdef str request_line(str version, bytes method, bytes target)
@cython.locals(names=dict, special=dict, name=bytes, value=bytes, lname=bytes, ctype=bytes, cl=bytes, te=bytes,
               conn=bytes, headers=list)
cpdef tuple read_headers(list raw, str version, max_bytes)
cpdef int plain_connection(value) except? -2
