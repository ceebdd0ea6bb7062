# Compile-time declarations for transitions.py (see content_keys.pxd): TransitionTable extends
# ForcedCompletions; its methods are called directly, from here and from the layers above (legal,
# automaton).

cimport cython
from railcall.matcher.completion cimport ForcedCompletions

cdef class TransitionTable(ForcedCompletions):
    cpdef object _intern(self, object threads)
    cpdef object step(self, object s, object b)
    cpdef object specials(self, object s)
    cpdef object first_bytes(self, object s)
    cpdef object is_accepting(self, object s)
    cpdef object _init_row(self, object s)
    cpdef object _delta(self, object cur, object b)
    cpdef object _walk_from(self, object s)
    # the trie walk's loop runs on C ints and typed memoryviews (np.int32 table and indexes)
    @cython.locals(byte="unsigned char[::1]", depth="int[::1]", skip="int[::1]", lo="int[::1]",
                   count="int[::1]", ids="long long[::1]", states="int[::1]", out="long long[::1]",
                   table="int[:, ::1]", n=Py_ssize_t, i=Py_ssize_t, j=Py_ssize_t, end=Py_ssize_t,
                   k=Py_ssize_t, d=Py_ssize_t, nxt=int, unbuilt=int)
    cpdef object _walk_nodes(self, object s)
    cpdef object _built_step(self, object s, object b)
    cpdef object _walk_levels(self, object s)
    cpdef object _walk(self, object idx, object pos, object cur)
    cpdef object _walk_bytes(self, object s, object data, object start, object memo)
    cpdef object _accepts(self, object s, object data, object start, object memo)
    cpdef object _thread_accepts(self, object t, object data, object start, object memo)
    cpdef object _arrival_state(self, object ins, object st)
