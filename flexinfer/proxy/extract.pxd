# The compiled build of extract.py: the body reads of every request as cpdef functions (C calls from
# pipeline.pxd's cimports, the same functions from Python). The .py is the pure twin. The .py says
# @cython.annotation_typing(False) where Cython would not match its dict[...] annotations with these
# declarations (flexinfer/_nocython.py). normalize_path, route_path and check_model_name are C calls
# too: their memos are plain dicts (the .py says why).
cimport cython

cpdef _remember(dict memo, str key, value)
@cython.locals(memo=dict)
cpdef str check_model_name(str name, str source)
@cython.locals(memo=dict)
cpdef str normalize_path(str path)
@cython.locals(memo=dict)
cpdef tuple route_path(str path)
cpdef tuple parse_json_counted(bytes body)
cpdef body_model(dict data)
cpdef bytes rewrite_model(bytes body, dict data, str new, scan=*)
