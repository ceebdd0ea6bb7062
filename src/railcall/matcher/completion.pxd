# Compile-time declarations for completion.py (see keys.pxd): Completions extends ContentKeys.

from railcall.matcher.keys cimport ContentKeys

cdef class Completions(ContentKeys):
    pass
