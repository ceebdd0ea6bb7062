# Compile-time declarations for automaton.py (see content_keys.pxd): the automaton's hot methods,
# called directly from each other (cpdef: still callable, and overridable by a subclass, from
# Python). Automaton extends ThreadLegalTokens, which extends TransitionTable, ForcedCompletions
# and ContentKeyBuilder.

from railcall.matcher.legal cimport ThreadLegalTokens
from railcall.matcher.entries cimport _Bits, _union, entry_dense

cdef class Automaton(ThreadLegalTokens):
    cpdef object _coarse_key(self, object s)
    cpdef object mask(self, object s)
    cpdef object _thread_mask(self, object t)
    cpdef object _thread_entry(self, object t)
    cpdef _Bits _legal_bits(self, object s)

cpdef object _walked(object threads)
cpdef object _stacked(object threads)
