# The declaration of chunkframe_c's frame_chunk, for a module that cimports it: the compiled response
# writer (flexinfer/http/request.pxd) frames each relayed read of a chunked stream with a C call
# (a Python call otherwise). The .pyx has the code; chunkframe_py the pure twin.

cpdef bytes frame_chunk(prefix, data)
