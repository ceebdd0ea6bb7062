# Compile-time declarations for automaton.py (see keys.pxd): the automaton's hot methods, called
# directly from each other (cpdef: still callable, and overridable by a subclass, from Python).

from railcall.matcher.completion cimport Completions
from railcall.matcher.keys cimport ContentKeys
from railcall.matcher.entries cimport _Bits, _union, entry_dense

cdef class Automaton(Completions):
    cpdef object _intern(self, object threads)
    cpdef object step(self, object s, object b)
    cpdef object specials(self, object s)
    cpdef object first_bytes(self, object s)
    cpdef object mask(self, object s)
    cpdef object _thread_mask(self, object t)
    cpdef object _thread_entry(self, object t)
    cpdef object _after(self, object ins, object st)
    cpdef object _rest_legal(self, object rest, object nxt, object st, _Bits bits)
    cpdef object _walk(self, object idx, object pos, object cur)
    cpdef object _walk_bytes(self, object s, object data, object start, object memo)
    cpdef object _accepts(self, object s, object data, object start, object memo)
    cpdef object _thread_accepts(self, object t, object data, object start, object memo)
    cpdef object _jstr_entry(self, object ins, object loc, object st)
    cpdef object _jnum_legal(self, object ins, object loc, object st, _Bits bits)
    cpdef object is_accepting(self, object s)
    cpdef object _coarse_key(self, object s)
    cpdef _Bits _legal_bits(self, object s)
    cpdef object _init_row(self, object s)
    cpdef object _delta(self, object cur, object b)
    cpdef object _walk_from(self, object s)
    cpdef object _prefix_tokens(self, object p, object x, _Bits bits, object exact_ok=*)
    cpdef object _into_string(self, object p, object ins, object loc, object st)
    cpdef object _select_legal(self, object ins, object node, object st, _Bits bits, object prefix=*)
    cpdef object _jint_legal(self, object ins, object loc, object st, _Bits bits)
    cpdef object _exits_after(self, object sub, object x, object idx, object after)
    cpdef object _exits_by_rest(self, object sub, object x, object idx)
    cpdef object _accepted_texts(self, object x, object keys)
    cpdef object _accepted_run(self, object x, object keys, object a, object b, object start, object memo, object hits)
    cpdef object _exits_into_literal(self, object sub, object thread, object idx)

cpdef object _jint_run(object step, object loc, object data)
cpdef object _walked(object threads)
