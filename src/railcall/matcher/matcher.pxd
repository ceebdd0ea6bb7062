# Compile-time declarations for matcher.py (see content_keys.pxd): a Matcher's fields as C fields,
# the automaton it reads as its extension type, and the per-token verbs as direct calls.

# cimported under another name: `Automaton` stays the module's Python global, which builds a
# vocabulary's automaton (and which tests replace with a spying subclass)
from railcall.matcher.automaton cimport Automaton as AutomatonType

cdef class Matcher:
    cdef public object compiled, _tags, error_message, last_legal_count, cut
    cdef public AutomatonType g
    cdef public list _states, _tn
    cdef public Py_ssize_t _stopped, _error_at
    cdef public bint _error, _live
    cpdef object fill_bitmask(self, object bitmask, object index=*)
    cpdef object _fill_stops(self, object row)
    cpdef object _fail(self, object why)
    cpdef object _enter_error(self, object why)
    cpdef object consume_token(self, object token_id)
    cpdef object _consume_slow(self, object token_id)
    cpdef object _advanced(self, object s0, object token_id, object s)
