# Compile-time declarations for completion.py (see content_keys.pxd): ForcedCompletions extends
# ContentKeyBuilder.

from railcall.matcher.content_keys cimport ContentKeyBuilder

cdef class ForcedCompletions(ContentKeyBuilder):
    pass
