"""The llama.cpp backend: a GGUF file run natively by llama.cpp (through llama-cpp-python's
low-level API), its quantized CPU kernels instead of a de-quantized float32 copy in torch.

One `LlamaModel` per model: the weights (memory-mapped from the GGUF) and one llama.cpp context
whose KV cells every sequence shares (`kv_unified`). Everything above it is railcall's: the mask,
the sampling, fast-forward, the rows. The model only ever runs a list of tokens, each with its
sequence ids and position, and hands back the logits of the positions asked for.

    rows of the batch loop   one llama.cpp sequence each (a seq id), decoded together per step
    forced tokens            extra positions of the row's sequence in the same llama_decode
    a row that leaves        llama_memory_seq_rm: its cells are free at once
    a row copied (n > 1)     llama_memory_seq_cp: the cells gain a sequence id, nothing is copied
    the prefix cache         a kept sequence (seq_cp of a finished row); a hit copies its first m
                             positions into the new row's sequence, again without copying data
    scored routing           one pass over the names' trie: each branch a scratch sequence holding
                             the row's cells, a trie node carries the ids of every branch through it

Why a shared (unified) KV cache: sequences then share cells, so n > 1, the prefix cache and the
branch pass cost no memory and no copy; with a KV buffer per sequence llama.cpp would copy them.

Logits: llama.cpp writes them into a buffer of its own that the next llama_decode reuses (and
may reallocate). The batch loop reads one step's logits after the next decode has run (a row
that joins is prefilled before the live rows advance; a scoring pass runs in the middle of a
step), so each decode's output rows are copied once into a numpy array: rows x width floats,
~0.2 MB per row on SmolLM2's 49k vocabulary, ~20 us, against milliseconds for the pass. The rows
mask and sample numpy logits with numpy (railcall.runtime.decode): no torch on this path.

Lifecycles: `LlamaModel` once per model (one thread drives it: the loop's); `LlamaBatch` per
batch of rows in a loop; `KeptSequence` per prefix-cache entry; `LlamaBackend` per
single-sequence user (the agent, the demo).
"""

from __future__ import annotations

import collections
import ctypes
import os
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

import numpy as np

from railcall.errors import ModelError, require

# Cells of the shared KV cache (tokens over all live sequences, kept prefixes included), allocated
# whole when the model loads: SmolLM2-135M keeps ~23 KB per cell in f16, so 8,192 cells are
# ~190 MB and hold a server's 16 rows of 400 tokens with room for kept prefixes (which give
# theirs up, least recently used first, when rows need them). More cells cost more than memory:
# a step attends over the span of cells in use, and with 16,384 the server's 8-client
# throughput was 74 tokens/s against 83 with 8,192 (SmolLM2, 2 cores). A sequence is bounded by
# the smaller of the trained context and the cells (`config.max_position_embeddings`, what the
# server checks a prompt against). RAILCALL_LLAMA_CELLS sets another count.
DEFAULT_CELLS = int(os.environ.get("RAILCALL_LLAMA_CELLS", "8192"))
SINGLE_CELLS = min(8192, DEFAULT_CELLS)
# Sequence ids: live rows + kept prefixes + scratch ids of a scoring pass (llama.cpp's limit: 256).
DEFAULT_SEQUENCES = 64
# Tokens handed to one llama_decode; a longer prefill runs in several calls.
DEFAULT_BATCH = 2048
# llama.cpp's flash attention: 0 off, 1 on, -1 its own choice. Off: on 2 cores a step of 16 rows
# of SmolLM2 took 111 ms without it and 137-175 ms with it (attention over short rows is a small
# share of a step, and the flash kernel's tiling does not pay there).
FLASH_ATTENTION = int(os.environ.get("RAILCALL_LLAMA_FLASH_ATTENTION", "0"))
# llama.cpp's extra weight buffers: quantized weights repacked for the CPU's wider kernels (a
# 150-token prefill 2.8 s -> 0.7 s, a step of 16 rows 125 -> 92 ms, on 2 cores), and AMX where
# llama.cpp was built with it. `make setup` builds it without AMX: on a virtual machine that
# lists AMX without running it, its kernel ends the process with an illegal instruction (seen
# here); RAILCALL_LLAMA_EXTRA_BUFFERS=0 turns the buffers off for a build that has it.
EXTRA_BUFFERS = os.environ.get("RAILCALL_LLAMA_EXTRA_BUFFERS", "1") != "0"

_log_lock = threading.Lock()
_log_tail: collections.deque[str] = collections.deque(maxlen=20)
_log_callback = None  # the ctypes callback must outlive every call llama.cpp makes to it
_backend_ready = False


def _quiet_logs() -> None:
    """llama.cpp logs every load and context at length on stderr; keep its warnings and errors
    (the last few, to quote in an error message) and print nothing unless RAILCALL_LLAMA_LOG=1."""
    global _log_callback, _backend_ready
    import llama_cpp

    if _log_callback is not None:
        return
    loud = os.environ.get("RAILCALL_LLAMA_LOG") == "1"

    @llama_cpp.llama_log_callback
    def keep(level, text, user_data):  # ggml_log_level: 1 info, 2 warn, 3 error, 4 debug, 5 cont
        s = text.decode("utf-8", "replace") if text else ""
        if loud:
            print(s, end="", flush=True)
        if level in (2, 3):
            with _log_lock:
                _log_tail.append(s.strip())

    _log_callback = keep
    llama_cpp.llama_log_set(keep, ctypes.c_void_p(0))
    if not _backend_ready:
        llama_cpp.llama_backend_init()
        _backend_ready = True


def _last_log() -> str:
    with _log_lock:
        lines = [s for s in _log_tail if s]
        _log_tail.clear()
    return ("; llama.cpp said: " + " | ".join(lines[-3:])) if lines else ""


# GGUF file types llama.cpp has no batched CPU kernel for without AMX (LLAMA_FTYPE_MOSTLY_Q4_1: no
# weight repacking, no tiled matrix product), and the type they are re-laid out in once.
REQUANTIZE = {3: (7, "q8_0")}  # Q4_1 -> Q8_0 (LLAMA_FTYPE_MOSTLY_Q8_0)


def runnable_weights(path: Path, name: str) -> Path:
    """The GGUF llama.cpp runs for `path`: the file itself, or, for a Q4_1 file, its weights
    re-laid out as Q8_0 once and cached beside railcall's other caches.

    Why: on a CPU without (working) AMX, llama.cpp multiplies Q4_1 weights one row of tokens at a
    time; Q8_0 has repacked and tiled kernels. Measured on 2 cores, SmolLM2-135M: a 1,000-token
    prefill 7.0 s -> 3.9 s, a step of 16 rows 120 -> 77 ms, one row 15.4 -> 15.2 ms. Every Q4_1
    weight (32 per block, d*q + m) is kept to within Q8_0's rounding (max|w| / 254 per block,
    about a seventeenth of a Q4_1 step), so the model is the same to that precision; the file
    is 145 MB instead of 85 MB and takes under a second to write. RAILCALL_LLAMA_REQUANTIZE=0
    runs the file as it is."""
    from railcall.home import file_digest, railcall_home
    from railcall.gguf import read_metadata

    if os.environ.get("RAILCALL_LLAMA_REQUANTIZE", "1") == "0":
        return path
    kind = read_metadata(path).get("general.file_type")
    if kind not in REQUANTIZE:
        return path
    ftype, label = REQUANTIZE[kind]
    out = railcall_home() / "models" / f"{name}-{file_digest(path)}-{label}.gguf"
    if out.is_file():
        return out
    import llama_cpp

    _quiet_logs()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.nthread = default_threads()
    try:
        if llama_cpp.llama_model_quantize(str(path).encode(), str(tmp).encode(), params) != 0:
            raise ModelError(f"llama.cpp could not re-lay {path} out as {label}{_last_log()}; "
                             "RAILCALL_LLAMA_REQUANTIZE=0 runs the file as it is")
        os.replace(tmp, out)  # whole or nothing: a cache file is never half written
    finally:
        tmp.unlink(missing_ok=True)
    return out


def default_threads() -> int:
    """Threads for llama.cpp: $RAILCALL_THREADS (the CLI's --threads sets it), else the cores this
    process may use (all of them on a 2-core machine)."""
    env = os.environ.get("RAILCALL_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class KVFull(ModelError):
    """No free cells (or sequence ids) for what a decode needs, even after dropping kept prefixes."""


class KeptSequence:
    """A prefix-cache entry's KV: a sequence of the model's context holding the cells of a token
    sequence a row ran. Made by `LlamaBatch.row_kv`; `release()` frees its sequence id (its
    cells too, where no live row shares them). The model may release it first when it runs out
    of cells or ids (least recently used first, never while `pins` > 0: a hit between its lookup
    and its copy into the row); `alive` then reads False and the prefix cache drops it."""

    def __init__(self, model: "LlamaModel", seq: int, tokens: int):
        self.model = model
        self.seq = seq
        self.tokens = tokens
        self.nbytes = tokens * model.bytes_per_token  # an upper bound: cells shared with rows count once
        self.alive = True
        self.pins = 0

    def touch(self) -> None:
        """A hit: the entry becomes the model's most recently used, and is pinned until `unpin`."""
        if self.alive:
            self.model._kept.move_to_end(self.seq)
            self.pins += 1

    def unpin(self) -> None:
        self.pins = max(0, self.pins - 1)

    def release(self) -> None:
        if self.alive:
            self.alive = False
            self.model._kept.pop(self.seq, None)
            self.model.free_seq(self.seq)


class LlamaModel:
    """A GGUF model loaded in llama.cpp, with one context whose KV cells all sequences share.
    Built once per model; driven from one thread.

    `decode(items)` runs tokens, `items` being (sequence ids, token, position, wants logits) in
    the order llama.cpp needs (per sequence, positions continuing its cells); it returns the
    (outputs, width) float32 logits of the items that asked, in their order. The batch objects
    and the single-sequence backend below are the loop's views of it.
    """

    def __init__(self, path: str | os.PathLike, *, threads: int | None = None, cells: int = DEFAULT_CELLS,
                 sequences: int = DEFAULT_SEQUENCES, batch: int = DEFAULT_BATCH):
        require("running a GGUF model on llama.cpp", "llama_cpp", extra="llama")
        import llama_cpp

        self._ll = llama_cpp
        self.path = Path(path)
        _quiet_logs()
        mp = llama_cpp.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.use_extra_bufts = EXTRA_BUFFERS
        self._ctx = None
        self._model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), mp)
        if not self._model:
            raise ModelError(f"llama.cpp could not load {self.path}: the file is not a complete GGUF model "
                             f"(truncated, damaged, or an architecture this llama.cpp does not know){_last_log()}; "
                             "pass a complete .gguf file, or --backend transformers for a Hugging Face folder")
        if llama_cpp.llama_model_is_recurrent(self._model) or llama_cpp.llama_model_is_hybrid(self._model):
            llama_cpp.llama_model_free(self._model)
            self._model = None
            raise ModelError(f"{self.path} is a recurrent or hybrid model: railcall's llama.cpp backend shares and "
                             "trims KV cells between sequences, which such a model's state cannot do; "
                             "run it with --backend transformers")
        self.threads = threads or default_threads()
        cp = llama_cpp.llama_context_default_params()
        self.train_context = int(llama_cpp.llama_model_n_ctx_train(self._model))
        cp.n_ctx = cells
        cp.n_batch = batch
        cp.n_ubatch = min(512, batch)
        cp.n_seq_max = sequences
        cp.kv_unified = True
        cp.n_threads = self.threads
        cp.n_threads_batch = self.threads
        cp.no_perf = True
        cp.flash_attn_type = FLASH_ATTENTION
        self._ctx = llama_cpp.llama_init_from_model(self._model, cp)
        if not self._ctx:
            self._ctx = None
            llama_cpp.llama_model_free(self._model)
            self._model = None
            raise ModelError(f"llama.cpp could not make a context for {self.path} ({cells} cells, "
                             f"{sequences} sequences){_last_log()}")
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.width = int(llama_cpp.llama_vocab_n_tokens(vocab))
        self.cells = int(llama_cpp.llama_n_ctx(self._ctx))
        self.sequences = sequences
        self.batch_size = int(llama_cpp.llama_n_batch(self._ctx))  # llama.cpp caps it at the cells
        layers = int(llama_cpp.llama_model_n_layer(self._model))
        heads, kv_heads = int(llama_cpp.llama_model_n_head(self._model)), int(llama_cpp.llama_model_n_head_kv(self._model))
        key_dim = self._meta_int("attention.key_length") or int(llama_cpp.llama_model_n_embd(self._model)) // max(heads, 1)
        value_dim = self._meta_int("attention.value_length") or key_dim
        self.bytes_per_token = layers * kv_heads * (key_dim + value_dim) * 2  # keys and values, f16
        # What the rest of railcall reads of a model's configuration (as of a transformers config):
        # one sequence is bounded by the trained context and by the cells.
        self.config = SimpleNamespace(vocab_size=self.width,
                                      max_position_embeddings=min(self.train_context or self.cells, self.cells))
        self._free = list(range(sequences - 1, -1, -1))  # a stack: the lowest id is taken first
        self._kept: collections.OrderedDict[int, KeptSequence] = collections.OrderedDict()  # seq -> entry, oldest first
        self._batch = llama_cpp.llama_batch_init(batch, 0, sequences)
        self._tok = np.ctypeslib.as_array(self._batch.token, shape=(batch,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(batch,))
        self._nseq = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(batch,))
        self._out = np.ctypeslib.as_array(self._batch.logits, shape=(batch,))
        self._seq_rows = [self._batch.seq_id[i] for i in range(batch)]  # per slot: its (sequences,) id array
        self.forward_passes = 0
        self.tokens_run = 0

    def _meta_int(self, key: str) -> int | None:
        """An integer of the model's GGUF metadata under its architecture ("attention.key_length")."""
        buf = ctypes.create_string_buffer(64)
        arch = ctypes.create_string_buffer(64)
        if self._ll.llama_model_meta_val_str(self._model, b"general.architecture", arch, 64) < 0:
            return None
        name = arch.value + b"." + key.encode()
        if self._ll.llama_model_meta_val_str(self._model, name, buf, 64) < 0:
            return None
        try:
            return int(buf.value)
        except ValueError:
            return None

    def _drop_oldest_kept(self) -> bool:
        """Release the least recently used kept prefix that no admission holds; False if none."""
        for kept in self._kept.values():
            if kept.pins == 0:
                kept.release()
                return True
        return False

    # -- sequence ids -------------------------------------------------------------------------

    def new_seq(self) -> int:
        """A free sequence id (its cells empty). Kept prefixes are released, least recently used
        first, when none is free."""
        while not self._free:
            if not self._drop_oldest_kept():
                raise KVFull(f"llama.cpp: all {self.sequences} sequences are in use by live rows; "
                             "run fewer rows at once")
        return self._free.pop()

    def free_seq(self, seq: int) -> None:
        if self._ctx is None:  # closed: nothing holds cells any more
            return
        self._ll.llama_memory_seq_rm(self._mem, seq, -1, -1)
        self._free.append(seq)

    def copy_seq(self, src: int, dst: int, end: int = -1) -> None:
        """Give `dst` the cells of `src` at positions [0, end) (all where end < 0): the cells gain
        a sequence id, no data moves."""
        self._ll.llama_memory_seq_cp(self._mem, src, dst, 0 if end >= 0 else -1, end)

    def keep_seq(self, seq: int, tokens: int) -> KeptSequence:
        """A kept copy of sequence `seq` (its first `tokens` positions) for the prefix cache."""
        dst = self.new_seq()
        self.copy_seq(seq, dst, tokens)
        kept = KeptSequence(self, dst, tokens)
        self._kept[dst] = kept
        return kept

    # -- running tokens -----------------------------------------------------------------------

    def decode(self, items: Sequence[tuple[Sequence[int], int, int, bool]]):
        """Run `items` ((sequence ids, token, position, wants logits) each); return the (outputs,
        width) float32 numpy logits of those that want them, in order. A run longer than the
        batch size goes in several llama_decode calls."""
        outs = []
        for at in range(0, len(items), self.batch_size):
            outs.append(self._decode_chunk(items[at: at + self.batch_size]))
        return outs[0] if len(outs) == 1 else np.concatenate(outs)

    def _decode_chunk(self, items):
        ll = self._ll
        if self._ctx is None:
            raise ModelError(f"the llama.cpp model {self.path} was closed")
        n = len(items)
        wants = 0
        for i, (seqs, tok, pos, out) in enumerate(items):
            self._tok[i] = tok
            self._pos[i] = pos
            self._nseq[i] = len(seqs)
            row = self._seq_rows[i]
            for j, s in enumerate(seqs):
                row[j] = s
            self._out[i] = 1 if out else 0
            wants += bool(out)
        self._batch.n_tokens = n
        while True:
            rc = ll.llama_decode(self._ctx, self._batch)
            if rc == 0:
                break
            if rc == 1 and self._drop_oldest_kept():  # no free cells: drop a kept prefix and try again
                continue
            if rc == 1:
                raise KVFull(f"llama.cpp: the KV cache's {self.cells} cells are full (live rows hold them all); "
                             f"run fewer rows at once or shorter prompts{_last_log()}")
            raise ModelError(f"llama.cpp failed to decode {n} tokens (llama_decode returned {rc}){_last_log()}")
        self.forward_passes += 1
        self.tokens_run += n
        if not wants:
            return np.zeros((0, self.width), dtype=np.float32)
        ptr = ll.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(ptr, shape=(wants, self.width)).copy()

    def run(self, seq: int, tokens: Sequence[int], start: int, *, logits: str | int = "last"):
        """Append `tokens` to sequence `seq` from position `start`; logits "last" (1, width),
        "all" (len(tokens), width), or the last k tokens' (k, width)."""
        n = len(tokens)
        k = 1 if logits == "last" else n if logits == "all" else int(logits)
        items = [((seq,), int(t), start + i, i >= n - k) for i, t in enumerate(tokens)]
        return self.decode(items)

    def branch_logits(self, seq: int, length: int, branches: Sequence[Sequence[int]]) -> list:
        """Scored routing: each branch's (len(branch), width) logits as if fed after sequence
        `seq` (which holds `length` positions), in one decode over the branches' trie
        (`railcall.models.backend.BranchTree`); the sequence is left as it was.

        Each branch gets a scratch sequence holding `seq`'s cells (no copy), and a trie node
        carries the ids of every branch through it. llama.cpp masks a token by its first
        sequence id: the cells of that branch up to the node's position, i.e. the prefix, the
        node's ancestors and itself, never a sibling (siblings hold other ids). Where there are
        more branches than free ids, they run in groups, a decode each."""
        from railcall.models.backend import BranchTree

        branches = [list(b) for b in branches]
        out: list = [None] * len(branches)
        todo = [i for i, b in enumerate(branches) if b]
        for i, b in enumerate(branches):
            if not b:
                out[i] = np.zeros((0, self.width), dtype=np.float32)
        while todo:
            group_size = max(1, min(len(todo), len(self._free) + len(self._kept) - 1, self.sequences // 2))
            group, todo = todo[:group_size], todo[group_size:]
            scratch = []
            try:
                for _ in group:
                    s = self.new_seq()
                    scratch.append(s)
                    self.copy_seq(seq, s, length)
                tree = BranchTree([branches[i] for i in group])
                members: list[list[int]] = [[] for _ in tree.tokens]
                for k, path in enumerate(tree.paths):
                    for node in path:
                        members[node].append(scratch[k])
                items = [(members[j], tok, length + tree.depth[j], True) for j, tok in enumerate(tree.tokens)]
                rows = tree.rows(self.decode(items))
            finally:
                for s in scratch:
                    self.free_seq(s)
            for i, r in zip(group, rows):
                out[i] = r
        return out

    def close(self) -> None:
        ll = self._ll
        if getattr(self, "_batch", None) is not None:
            ll.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            ll.llama_free(self._ctx)
        self._ctx = None
        if getattr(self, "_model", None):
            ll.llama_model_free(self._model)
            self._model = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def new_batch(self, pad_id: int = 0) -> "LlamaBatch":
        return LlamaBatch(self)


class LlamaBatch:
    """Rows of the batch loop as llama.cpp sequences of one `LlamaModel`, with the verbs of
    `railcall.models.backend.TransformersBatch` (start, start_cached, feed, keep, join, row_kv,
    branch_logits) and `release()` for when the loop drops it. Built per admission group, joined
    into the loop's batch; row numbers are positions in it. `begin` and `feed(tokens, wants)`
    let the loop prefill a prompt in chunks, beside the other rows' next tokens (`chunked`)."""

    chunked = True

    def __init__(self, model: LlamaModel):
        self.model = model
        self.width = model.width
        self.cells = model.cells  # the KV cells every row shares (the loop's admission counts them)
        self.seqs: list[int] = []  # per row: its sequence id
        self.pos: list[int] = []  # per row: the position of its next token (tokens its cells hold)
        self.forward_passes = 0
        self.last_cached = 0  # prompt tokens the last start_cached took from a kept sequence

    def _new_rows(self, n: int) -> list[int]:
        got = []
        try:
            for _ in range(n):
                got.append(self.model.new_seq())
        except Exception:
            for s in got:
                self.model.free_seq(s)
            raise
        return got

    def start(self, prompts: Sequence[Sequence[int]]):
        """Prefill the prompts, one row each, in one decode; (rows, width) logits."""
        seqs = self._new_rows(len(prompts))
        items = []
        for s, p in zip(seqs, prompts):
            n = len(p)
            items.extend(((s,), int(t), i, i == n - 1) for i, t in enumerate(p))
        try:
            logits = self.model.decode(items)
        except Exception:
            for s in seqs:
                self.model.free_seq(s)
            raise
        self.seqs += seqs
        self.pos += [len(p) for p in prompts]
        self.forward_passes += 1
        return logits

    def start_cached(self, prompt: Sequence[int], m: int, kv: KeptSequence):
        """One row whose first m tokens' cells are a kept sequence's: they are shared into the
        row's sequence, only prompt[m:] runs. (1, width) logits. Where the kept sequence was
        released after its lookup, the whole prompt runs; `last_cached` says how much was reused."""
        try:
            (s,) = self._new_rows(1)
        finally:
            kv.unpin()  # the lookup's pin: the copy below is the last use
        try:
            if kv.alive:
                self.model.copy_seq(kv.seq, s, m)
            else:
                m = 0
            logits = self.model.run(s, prompt[m:], m)
        except Exception:
            self.model.free_seq(s)
            raise
        self.last_cached = m
        self.seqs.append(s)
        self.pos.append(len(prompt))
        self.forward_passes += 1
        return logits

    def begin(self, m: int = 0, source=None) -> int:
        """A new row holding the first m positions of `source`, nothing run: a `KeptSequence`
        (a prefix-cache hit; its lookup's pin ends here) or a row b of this batch (another choice
        of the same prompt). The rest of its prompt runs in chunks through `feed`. Returns the
        positions it holds (0 where a kept sequence was released after its lookup)."""
        try:
            (s,) = self._new_rows(1)
        finally:
            if isinstance(source, KeptSequence):
                source.unpin()
        if isinstance(source, KeptSequence):
            m = m if source.alive else 0
            src = source.seq
        else:
            src = self.seqs[source] if source is not None else None
        if m and src is not None:
            self.model.copy_seq(src, s, m)
        self.seqs.append(s)
        self.pos.append(m if src is not None else 0)
        return self.pos[-1]

    def feed(self, tokens: Sequence[Sequence[int]], wants: Sequence[int] | None = None):
        """Append tokens[i] to row i, every row in one decode; the logits after the last wants[i]
        tokens of row i (one where `wants` is None; a draft wants more; a row wanting none may
        feed none: a prompt's chunk, or a row held this step), in row order. All or nothing:
        where the decode fails, no row keeps a cell of it."""
        items = []
        for b, (s, p, toks) in enumerate(zip(self.seqs, self.pos, tokens)):
            n = len(toks)
            want = 1 if wants is None else int(wants[b])
            items.extend(((s,), int(t), p + i, i >= n - want) for i, t in enumerate(toks))
        if not items:
            return np.zeros((0, self.width), dtype=np.float32)
        try:
            logits = self.model.decode(items)
        except Exception:  # a run longer than the batch size goes in several calls: undo the first
            for s, p in zip(self.seqs, self.pos):
                self.model._ll.llama_memory_seq_rm(self.model._mem, s, p, -1)
            raise
        self.pos = [p + len(t) for p, t in zip(self.pos, tokens)]
        self.forward_passes += 1
        return logits

    def drop(self, b: int, n: int) -> None:
        """Forget row b's last `n` fed tokens (their cells freed): draft tokens it did not decide."""
        if n:
            self.pos[b] -= n
            self.model._ll.llama_memory_seq_rm(self.model._mem, self.seqs[b], self.pos[b], -1)

    def keep(self, rows: Sequence[int]) -> None:
        """The batch becomes rows `rows` of the current one, in order: a row not named leaves (its
        cells freed at once), a row named twice is shared into a new sequence (no copy)."""
        seqs, pos, used, made = [], [], set(), []
        try:
            for b in rows:
                if b in used:
                    s = self.model.new_seq()
                    made.append(s)
                    self.model.copy_seq(self.seqs[b], s)
                else:
                    s = self.seqs[b]
                    used.add(b)
                seqs.append(s)
                pos.append(self.pos[b])
        except Exception:  # all or nothing: the copies made so far go, the batch stays as it was
            for s in made:
                self.model.free_seq(s)
            raise
        for b, s in enumerate(self.seqs):
            if b not in used:
                self.model.free_seq(s)
        self.seqs, self.pos = seqs, pos

    def join(self, other: "LlamaBatch") -> None:
        self.seqs += other.seqs
        self.pos += other.pos
        self.forward_passes += other.forward_passes
        other.seqs, other.pos = [], []

    def row_kv(self, b: int) -> KeptSequence:
        """Row b's cells kept for the prefix cache (a sequence of their own, no copy)."""
        return self.model.keep_seq(self.seqs[b], self.pos[b])

    def branch_logits(self, b: int, branches):
        return self.model.branch_logits(self.seqs[b], self.pos[b], branches)

    def release(self) -> None:
        """Free every row's sequence (the loop dropped the batch)."""
        for s in self.seqs:
            self.model.free_seq(s)
        self.seqs, self.pos = [], []


class LlamaBackend:
    """A single sequence on a `LlamaModel` (`railcall.models.backend.Backend`: start, feed,
    branch_logits). Built per user (the agent, the demo, `railcall info`); holds one sequence id.

    With `reuse_prefix=True` the cells of the previous sequence are kept and a prompt that starts
    with what was run before runs only the rest (an agent's next step); `last_cached` is how many
    prompt tokens the last `start` reused."""

    MIN_REUSE = 16

    def __init__(self, model: LlamaModel, *, reuse_prefix: bool = False):
        self.model = model
        self.width = model.width
        self.reuse_prefix = reuse_prefix
        self.seq = model.new_seq()
        self._tokens: list[int] = []
        self.forward_passes = 0
        self.last_cached = 0

    def start(self, prompt):
        prompt = [int(t) for t in prompt]
        m = 0
        if self.reuse_prefix and self._tokens:
            n = min(len(self._tokens), len(prompt) - 1)
            while m < n and self._tokens[m] == prompt[m]:
                m += 1
            if m < self.MIN_REUSE:
                m = 0
        self.model._ll.llama_memory_seq_rm(self.model._mem, self.seq, m, -1)
        self._tokens = prompt[:m]
        self.last_cached = m
        self.forward_passes = 0
        return self.feed(prompt[m:], keep=1)[-1]

    def feed(self, tokens, keep: int = 0):
        """Append tokens; (len(tokens), width) logits, or the last `keep` rows' where keep > 0."""
        tokens = [int(t) for t in tokens]
        out = self.model.run(self.seq, tokens, len(self._tokens), logits=keep if keep > 0 else "all")
        self._tokens.extend(tokens)
        self.forward_passes += 1
        return out

    def drop(self, n: int) -> None:
        """Forget the last `n` fed tokens (their cells freed): a draft's tokens the row did not decide."""
        if n:
            end = len(self._tokens) - n
            self.model._ll.llama_memory_seq_rm(self.model._mem, self.seq, end, -1)
            del self._tokens[end:]

    def branch_logits(self, branches):
        self.forward_passes += 1
        return self.model.branch_logits(self.seq, len(self._tokens), branches)

    def close(self) -> None:
        """Free the sequence (its cells too); also done when the backend is dropped."""
        if self.seq is not None:
            self.model.free_seq(self.seq)
            self.seq = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
