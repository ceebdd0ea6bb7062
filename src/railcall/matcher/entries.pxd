# Compile-time declarations for entries.py (see content_keys.pxd): the mask entries' helpers, called
# directly from the automaton, and the classes it reads fields of.

cdef class _Bits:
    cdef public object words
    cdef public list parts
    cdef public Py_ssize_t n
    cpdef object add(self, object ids)
    cpdef tuple entry(self)
    cpdef object packed(self)

cdef class MaskCache:
    cdef public object budget, used, made, lock
    cdef public dict _d
    cpdef object get(self, object key)
    cpdef object put(self, object key, object value)

cpdef tuple _sparse_entry(dict acc)
cpdef object entry_dense(tuple entry, object n_words)
cpdef tuple _union(list entries, object n_words)
