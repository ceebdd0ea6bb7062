# Compile-time declarations for content_keys.py, read by Cython only (see railcall/speedups.py):
# the source stays plain Python and says what the code does. ContentKeyBuilder is the first base
# of the automaton's extension type, so every field of the automaton is declared here, where the
# key builders read them as C fields (Automaton.__init__ sets them); its methods are called
# directly.

from railcall.matcher.entries cimport MaskCache

cdef class ContentKeyBuilder:
    cdef public object vocab, width, words, _zeros, stop_ids, _n_tokens, _is_special, _stop_set, _lock
    cdef public list _sets, _accepting, _only_accept, _specials, _first, _row_init, _state_mask, _token_next
    cdef public dict _ids, _forced, _arrival_memo, _cids, _cmemo, _extm, _lit_memo, _lit_cut_memo, _reach, _nextm
    cdef public MaskCache _masks
    cdef public object _table, _cnext, _token_next_size
    cdef public list _jstr_closes, _closing_subs
    cdef public set _costly, _walked, _walked_keys
    cdef public Py_ssize_t _budget, _n_threads
    cdef public object mask_computations

    cpdef object _intern_key(self, object content)
    cpdef object _state_content_key(self, object s)
    cpdef object _thread_key(self, object ins, object loc, object st)
    cpdef object _build_thread_key(self, object ins, object loc, object st)
    cpdef object _rest_key(self, object rest, object nxt, object st)
    cpdef object _lit_cuts(self, object data)
    cpdef object _rest_cut(self, object rest)
    cpdef object _jint_tree(self, object ins, object loc, object depth)
    cpdef object _plain_key(self, object ins, object loc, object st)
    cpdef object _lookahead_key(self, object ins, object loc, object st, object d)
    cpdef object _quote_key(self, object ins, object st, object reach=*)
    cpdef object _texts_key(self, object ins, object st, object which, object rests)
    cpdef object _quote_lits(self, object ins, object st, object p, object rests)
    cpdef object _arrival_key(self, object ins, object st, object inside, object arg)
    cpdef object _arrival_lookahead_key(self, object ins, object st, object d)
    cpdef object _arrival_prefix_key(self, object ins, object st, object p)
    cpdef object _prefix_key(self, object ins, object loc, object st, object p)
    cpdef object _texts_after(self, object p, object go)
    cpdef object _next_bytes(self, object p)
    cpdef object _select_key(self, object ins, object node, object st, object p)
    cpdef object _token_lcp(self, object data)
    cpdef object _longest_extension(self, object p)
    cpdef object _num_ext(self, object ins, object st)
