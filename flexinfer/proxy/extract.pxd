# The compiled build of extract.py: the body reads of every request as cpdef functions (C calls from
# pipeline.pxd's cimports, the same functions from Python). The .py is the pure twin. The .py says
# @cython.annotation_typing(False) where Cython would not match its dict[...] annotations with these
# declarations (flexinfer/_nocython.py). normalize_path, route_path and check_model_name stay def:
# functools.lru_cache wraps them.
cpdef tuple parse_json_counted(bytes body)
cpdef body_model(dict data)
cpdef bytes rewrite_model(bytes body, dict data, str new, scan=*)
