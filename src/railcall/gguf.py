"""GGUF metadata: the key-value section at the front of a GGUF file, read without its tensors.

A GGUF file is laid out front to back as

    magic "GGUF" | version u32 | tensor count u64 | key-value count u64
    key-values: key (u64 length + UTF-8) | value type u32 | value
    tensor index, then the tensor data

so everything railcall needs of a tokenizer -- its tokens, their types, the BPE merges, the
special ids and the chat template -- is in the first few MB (DeepSeek-R1-Distill-Qwen-7B: 5.9 MB
of 4.7 GB). `read_metadata` parses only that section, with the standard library, so it works on
a file cut short after its header (a split GGUF's first part, a partial download). The `gguf`
package's reader maps the tensors too, and fails on such a file ("cannot reshape array").

`tokenizer_from_metadata` turns a byte-level BPE tokenizer's metadata (`tokenizer.ggml.model`
= "gpt2") back into a Hugging Face fast tokenizer: the vocabulary and merges as llama.cpp
reads them, its added tokens (control ones special, user-defined ones as ordinary text), and the
chat template.

Lifecycle: both are run once per file; callers cache what they build (railcall.vocab's disk
cache, railcall.models.store's tokenizer folders).
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

from railcall.errors import ModelError

MAGIC = b"GGUF"

# GGUF value types -> struct format of the fixed-size ones
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9

# llama.cpp's token types (llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# The pre-tokenizer split of each `tokenizer.ggml.pre` railcall rebuilds, as llama.cpp applies it:
# Qwen2's regex (llama.cpp gives DeepSeek-R1-Distill-Qwen's "deepseek-r1-qwen" the same one),
# with no Unicode normalisation before it.
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_SPLITS = {"qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT}


class _Cut(Exception):
    """The file ended inside the metadata (internal: read_metadata says where)."""


class _Reader:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise _Cut()
        out = self.buf[self.pos:end]
        self.pos = end
        return out

    def scalar(self, kind: int):
        fmt = "<" + _SCALAR[kind]
        (v,) = struct.unpack(fmt, self.take(struct.calcsize(fmt)))
        return v

    def string(self) -> str:
        return self.take(self.scalar(10)).decode("utf-8", errors="surrogateescape")

    def value(self, kind: int):
        if kind in _SCALAR:
            return self.scalar(kind)
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, n = self.scalar(4), self.scalar(10)
            if item == _STRING:
                return [self.string() for _ in range(n)]
            if item in _SCALAR:  # one unpack for the whole array (152k token types: 1 ms)
                fmt = _SCALAR[item]
                return list(struct.unpack(f"<{n}{fmt}", self.take(n * struct.calcsize(fmt))))
            return [self.value(item) for _ in range(n)]
        raise ValueError(f"unknown GGUF value type {kind}")


def read_metadata(path: str | os.PathLike) -> dict:
    """The key-value metadata of the GGUF file at `path`, as a dict (arrays as lists).

    Reads the header and the key-values only, never the tensor index or data, so a file cut short
    anywhere after its metadata reads whole. Raises ModelError when the file is not a GGUF, or
    ends before its metadata does (saying at which byte and inside which key).
    """
    path = Path(path)
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    except OSError as e:
        raise ModelError(f"cannot read the GGUF file {path}: {e}") from None
    try:
        r = _Reader(buf)
        where = "its header (magic, version and counts: 24 bytes)"
        try:
            if r.take(4) != MAGIC:
                raise ModelError(f"{path} is not a GGUF file (it does not start with {MAGIC.decode()!r})")
            version = r.scalar(4)
            if version < 2:
                raise ModelError(f"{path} is GGUF version {version}; railcall reads versions 2 and 3")
            r.scalar(10)  # the tensor count: the tensors are not read
            count = r.scalar(10)
            meta: dict = {}
            for i in range(count):
                where = f"key-value {i + 1} of {count}"
                key = r.string()
                where += f" ({key!r})"
                meta[key] = r.value(r.scalar(4))
        except _Cut:
            raise ModelError(
                f"{path} is cut short: it ends at byte {size:,}, inside {where}. railcall reads a GGUF "
                "file whose tensors are missing, but its metadata must be whole; download the file (or "
                "its first part) again") from None
        except (struct.error, ValueError) as e:
            raise ModelError(f"{path} has malformed GGUF metadata in {where}: {e}") from None
        return meta
    finally:
        if isinstance(buf, mmap.mmap):
            buf.close()


def tokenizer_from_metadata(meta: dict):
    """A transformers fast tokenizer rebuilt from a byte-level BPE GGUF's metadata.

    Token ids are the GGUF's: the ordinary tokens form the BPE vocabulary with the file's merges,
    then its control tokens are added as special tokens and its user-defined ones (Qwen's
    `<think>`, `<tool_call>`) as ordinary added tokens, in id order. Unused tokens (padding rows
    such as `[PAD151665]`) are left out, as in the model's own tokenizer: the logits row is wider
    than the vocabulary there.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ModelError("the GGUF metadata has no tokenizer.ggml.tokens: the file carries no tokenizer")
    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre")
    if kind != "gpt2" or pre not in PRE_SPLITS:
        raise ModelError(
            f"railcall rebuilds byte-level BPE tokenizers (tokenizer.ggml.model 'gpt2') with the pre-tokenizer "
            f"{' or '.join(sorted(PRE_SPLITS))}; this GGUF has model {kind!r}, pre-tokenizer {pre!r}. Load its "
            "tokenizer with transformers from the complete GGUF file, or pass a tokenizer folder")
    types = meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens) if types[i] == NORMAL}
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_SPLITS[pre]), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    for i, ty in enumerate(types):
        if ty in (CONTROL, USER_DEFINED):
            added = AddedToken(tokens[i], special=ty == CONTROL, normalized=False)
            (tok.add_special_tokens if ty == CONTROL else tok.add_tokens)([added])
            if tok.token_to_id(tokens[i]) != i:
                raise ModelError(f"the GGUF's added token {tokens[i]!r} has id {i}, which the rebuilt tokenizer "
                                 "cannot give it (its ordinary tokens are not numbered 0..n-1)")

    def name(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    bos = name("bos")
    if meta.get("tokenizer.ggml.add_bos_token") and bos is not None:
        # encode(..., add_special_tokens=True) starts with BOS, as llama.cpp's tokenizer does
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, tokens.index(bos))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=name("eos"),
                                   pad_token=name("padding"), unk_token=name("unknown"),
                                   chat_template=meta.get("tokenizer.chat_template"))
