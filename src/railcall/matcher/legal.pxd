# Compile-time declarations for legal.py (see content_keys.pxd): ThreadLegalTokens extends
# TransitionTable.

from railcall.matcher.transitions cimport TransitionTable
from railcall.matcher.entries cimport _Bits

cdef class ThreadLegalTokens(TransitionTable):
    cpdef object _prefix_tokens(self, object p, object x, _Bits bits, object exact_ok=*)
    cpdef object _into_string(self, object p, object ins, object loc, object st)
    cpdef object _rest_legal(self, object rest, object nxt, object st, _Bits bits)
    cpdef object _select_legal(self, object ins, object node, object st, _Bits bits, object prefix=*)
    cpdef object _jnum_legal(self, object ins, object loc, object st, _Bits bits)
    cpdef object _jint_legal(self, object ins, object loc, object st, _Bits bits)
    cpdef object _jstr_entry(self, object ins, object loc, object st)
    cpdef object _exits_after(self, object sub, object x, object idx, object after)
    cpdef object _exits_by_rest(self, object sub, object x, object idx)
    cpdef object _accepted_texts(self, object x, object keys)
    cpdef object _accepted_run(self, object x, object keys, object a, object b, object start, object memo, object hits)
    cpdef object _exits_into_literal(self, object sub, object thread, object idx)

cpdef object _jint_run(object step, object loc, object data)
