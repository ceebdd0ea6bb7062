"""Vocabulary: every token id as the exact bytes it adds to the output.

The grammar is defined over bytes and enforced over tokens, so the engine needs, for every token
id, the bytes that token contributes -- exactly, at the byte level. Decoding a token to `str` is
wrong for this: a token may be a fragment of a UTF-8 character (byte-fallback `<0xE2>`, or a
byte-level BPE piece that splits an emoji), and decoding it would produce U+FFFD replacement
characters that the grammar would then check instead of the real bytes.

Lifecycle: a Vocabulary is built once per tokenizer and shared, read-only, by every grammar
compiled against it and every request. Building from a tokenizer costs ~0.1 s for 49k tokens and
~1 s for 262k; `Vocabulary.cached()` stores the result on disk under `$RAILCALL_HOME/vocab/`,
keyed by a hash of the tokenizer's content, and later builds read it back in milliseconds.
The derived indexes (`byte_matrix`, `first_byte_index`, `lookup`) are computed lazily, once.

This module knows nothing about grammars: it answers "which bytes does token t add", "which
tokens are special", "which ids stop generation", and offers indexes that let a grammar find
candidate tokens without scanning the whole vocabulary in Python.

Token kinds handled:
- byte-level BPE (GPT-2 byte map; SmolLM2, Llama 3, Qwen): each char of the token string maps
  back to one byte through the inverse of GPT-2's bytes_to_unicode table;
- SentencePiece style (Gemma, Llama 2): `▁` is a space, `<0xNN>` byte-fallback tokens are one
  raw byte, everything else is its UTF-8;
- added tokens: special ones (control tokens such as `<|im_end|>`, `<think>`) are flagged and
  contribute no text bytes -- the grammar can only reference them by id; non-special added
  tokens (user-defined pieces such as Gemma's whitespace runs) are text, as their raw UTF-8.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from railcall.errors import VocabularyError

# Chat end-of-turn tokens that stop generation when they are special tokens of the vocabulary.
# EOS itself is always a stop token; these cover instruct models whose turn ends earlier.
END_OF_TURN_NAMES = (
    "<|im_end|>",  # ChatML (SmolLM2-Instruct, Qwen)
    "<end_of_turn>",  # Gemma
    "<|eot_id|>",  # Llama 3
    "<|end|>",  # Phi
    "<｜end▁of▁sentence｜>",  # DeepSeek (R1 and its Qwen and Llama distills): EOS, named by a bare tokenizer.json
    "<|endoftext|>",
    "<|end_of_text|>",
    "<eos>",
    "</s>",
)

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def gpt2_unicode_to_byte() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode: printable stand-in char -> original byte.

    Byte-level BPE stores every byte as a printable character: bytes that are already printable
    (and not space) keep their own code point, the other 68 are shifted to U+0100 and up, in
    order. So `Ġ` (U+0120) is a space and `Ċ` (U+010A) a newline.
    """
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table = {chr(b): b for b in keep}
    n = 0
    for b in range(256):
        if b not in keep:
            table[chr(256 + n)] = b
            n += 1
    return table


_U2B = gpt2_unicode_to_byte()


def byte_level_bytes(piece: str) -> bytes:
    try:
        return bytes(_U2B[c] for c in piece)
    except KeyError as e:
        raise VocabularyError(f"token {piece!r} has a char {e} outside the GPT-2 byte map") from None


def sentencepiece_bytes(piece: str) -> bytes:
    m = _BYTE_FALLBACK.match(piece)
    if m:
        return bytes([int(m.group(1), 16)])
    return piece.replace("\u2581", " ").encode("utf-8")


@dataclass(eq=False)
class Vocabulary:
    """Token id -> bytes, special tokens, stop set and the indexes a grammar needs.

    Built once per tokenizer (see the module docstring); immutable after construction.

    Fields:
      token_bytes   list[bytes], one per id in [0, size): the bytes the token adds; b"" for
                    special tokens (they add no text the grammar can see).
      special       (size,) bool: control / added-special tokens, never treated as text.
      special_text  id -> the token's literal text ("<|im_end|>"), for display and delimiters.
      stop_ids      ids that end generation (EOS and chat end-of-turn tokens).
      logits_width  width of the model's logits row; >= size. Ids in [size, width) are padding
                    and are never legal.
      encoder       the tokenizer's own encoding of text (no special tokens added), attached
                    where the vocabulary is built beside a tokenizer (`from_hf`, the model
                    store's llama.cpp tokenizer); None otherwise. Read through `encode`.
    """

    token_bytes: list[bytes]
    special: np.ndarray
    special_text: dict[int, str]
    stop_ids: tuple[int, ...]
    logits_width: int
    eos_id: int | None = None
    name: str = "vocab"
    key: str = ""
    encoder: Callable[[str], Sequence[int]] | None = field(default=None, repr=False)
    _extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        n = len(self.token_bytes)
        if self.special.shape != (n,):
            raise VocabularyError(f"special flags have shape {self.special.shape}, expected ({n},)")
        if self.logits_width < n:
            raise VocabularyError(f"logits width {self.logits_width} is smaller than the vocabulary ({n})")
        for i in self.stop_ids:
            if not 0 <= i < n:
                raise VocabularyError(f"stop id {i} is outside the vocabulary (size {n})")
        if not self.key:
            self.key = self._content_key()

    # -- basic facts ------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return len(self.token_bytes)

    def __len__(self) -> int:
        return len(self.token_bytes)

    def is_special(self, token_id: int) -> bool:
        return bool(self.special[token_id])

    def token_text(self, token_id: int) -> str:
        """Human-readable text of one token (specials by name; fragments with escapes)."""
        if self.special[token_id]:
            return self.special_text.get(token_id, f"<special {token_id}>")
        return self.token_bytes[token_id].decode("utf-8", errors="backslashreplace")

    def decode(self, ids: Iterable[int]) -> bytes:
        """The text bytes of a token sequence; special tokens contribute nothing."""
        return b"".join(self.token_bytes[i] for i in ids if 0 <= i < self.size)

    def special_id(self, text: str) -> int | None:
        """The id of the special token whose literal text is `text`, if there is one."""
        return self._special_by_text.get(text)

    @cached_property
    def _special_by_text(self) -> dict[str, int]:
        return {t: i for i, t in self.special_text.items()}

    # -- indexes for the engine (lazy, built once) ---------------------------------------------

    @cached_property
    def lengths(self) -> np.ndarray:
        """(size,) int32: bytes each token adds; 0 for specials and empty tokens."""
        return np.fromiter((len(b) for b in self.token_bytes), dtype=np.int32, count=self.size)

    @cached_property
    def max_token_len(self) -> int:
        return int(self.lengths.max()) if self.size else 0

    @cached_property
    def max_number_run(self) -> int:
        """The most bytes of a JSON number one token can add: its longest leading run of
        `0-9 + - . e E` (a token's number part must come first: a number only starts a token or
        continues from the previous one)."""
        num = np.zeros(256, dtype=bool)
        num[list(b"0123456789+-.eE")] = True
        B = self.byte_matrix
        run = np.zeros(self.size, dtype=np.int64)
        alive = np.ones(self.size, dtype=bool)
        for j in range(B.shape[0]):
            alive &= num[B[j]] & (self.lengths > j)
            run += alive
        return int(run.max()) if self.size else 0

    @cached_property
    def byte_matrix(self) -> np.ndarray:
        """(max_token_len, size) uint8, column j holding every token's j-th byte (0 past the end).

        Stored position-major so that "the j-th byte of these tokens" is a gather from one
        contiguous row -- the inner step of the engine's vectorised token walk.
        """
        lens = self.lengths
        width = self.max_token_len
        flat = np.frombuffer(b"".join(self.token_bytes), dtype=np.uint8)
        mat = np.zeros((self.size, max(width, 1)), dtype=np.uint8)
        # Scatter the concatenated bytes into the padded rows in one vectorised pass.
        rows = np.repeat(np.arange(self.size), lens)
        starts = np.cumsum(lens) - lens
        cols = np.arange(flat.size) - np.repeat(starts, lens)
        mat[rows, cols] = flat
        return np.ascontiguousarray(mat.T)

    @cached_property
    def first_byte_index(self) -> tuple[np.ndarray, np.ndarray]:
        """(order, offsets): text-token ids grouped by first byte.

        `order[offsets[b]:offsets[b+1]]` are the ids whose first byte is b, so a grammar state
        that allows few first bytes looks at those groups only, never the whole vocabulary.
        Specials and empty tokens are in no group.
        """
        lens = self.lengths
        ids = np.nonzero(lens > 0)[0].astype(np.int32)
        first = self.byte_matrix[0][ids]
        order = ids[np.argsort(first, kind="stable")]
        counts = np.bincount(first, minlength=256)
        offsets = np.zeros(257, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return order, offsets

    @cached_property
    def lookup(self) -> dict[bytes, int]:
        """bytes -> id for text tokens (the lowest id where several tokens share bytes)."""
        out: dict[bytes, int] = {}
        for i, b in enumerate(self.token_bytes):
            if b and not self.special[i] and b not in out:
                out[b] = i
        return out

    @cached_property
    def duplicates(self) -> dict[bytes, tuple[int, ...]]:
        """bytes -> the other ids with exactly these bytes (rare: most vocabularies have none)."""
        out: dict[bytes, list[int]] = {}
        lookup = self.lookup
        for i, b in enumerate(self.token_bytes):
            if b and not self.special[i] and lookup[b] != i:
                out.setdefault(b, []).append(i)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def sorted_index(self) -> tuple[list[bytes], np.ndarray]:
        """(bytes, ids): every text token's bytes in sorted order and the matching ids.

        Tokens sharing a prefix form one contiguous range, so "which tokens start with p" is two
        binary searches (`prefix_range`) -- a trie in a flat array, without building one.
        """
        ids = [i for i in range(self.size) if self.token_bytes[i] and not self.special[i]]
        ids.sort(key=lambda i: self.token_bytes[i])
        return [self.token_bytes[i] for i in ids], np.array(ids, dtype=np.int64)

    def prefix_range(self, prefix: bytes, lo: int = 0, hi: int | None = None) -> tuple[int, int]:
        """The range [a, b) of `sorted_index` whose tokens start with `prefix`."""
        import bisect

        s = self.sorted_index[0]
        hi = len(s) if hi is None else hi
        a = bisect.bisect_left(s, prefix, lo, hi)
        end = prefix.rstrip(b"\xff")
        if not end:
            return a, hi
        b = bisect.bisect_left(s, end[:-1] + bytes([end[-1] + 1]), a, hi)
        return a, b

    def has_extension(self, prefix: bytes) -> bool:
        """Whether some text token strictly extends `prefix`."""
        a, b = self.prefix_range(prefix)
        # the range is sorted, so any longer token comes after every copy of `prefix` itself
        # (a vocabulary may hold one text under several ids: Gemma 3 has 110 such)
        return b > a and len(self.sorted_index[0][b - 1]) > len(prefix)

    def greedy_tokenize(self, data: bytes) -> list[int] | None:
        """Longest-match tokenization of `data`; None if some byte has no token."""
        out = []
        lookup = self.lookup
        i = 0
        top = self.max_token_len
        while i < len(data):
            for n in range(min(top, len(data) - i), 0, -1):
                t = lookup.get(data[i : i + n])
                if t is not None:
                    out.append(t)
                    i += n
                    break
            else:
                return None
        return out

    # -- identity and the disk cache ------------------------------------------------------------

    def _content_key(self) -> str:
        h = hashlib.sha256()
        for i, b in enumerate(self.token_bytes):
            h.update(len(b).to_bytes(4, "little"))
            h.update(b)
        h.update(self.special.tobytes())
        h.update(json.dumps(sorted(self.special_text.items())).encode())
        h.update(json.dumps([list(self.stop_ids), self.logits_width]).encode())
        return h.hexdigest()[:24]

    def encode(self, text: str) -> list[int] | None:
        """`text` as the tokenizer encodes it (its own merges, no special tokens added), or None
        where no tokenizer is attached (`encoder`); then `greedy_tokenize` is the fallback."""
        return None if self.encoder is None else list(self.encoder(text))

    def save(self, path: Path) -> None:
        """Write to `path` atomically (a temporary file renamed into place)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        lens = np.fromiter((len(b) for b in self.token_bytes), dtype=np.int64, count=self.size)
        meta = {
            "special_text": {str(k): v for k, v in self.special_text.items()},
            "stop_ids": list(self.stop_ids),
            "logits_width": self.logits_width,
            "eos_id": self.eos_id,
            "name": self.name,
            "key": self.key,
        }
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            np.savez(
                f,
                data=np.frombuffer(b"".join(self.token_bytes), dtype=np.uint8),
                lens=lens,
                special=self.special,
                meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
            )
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> "Vocabulary":
        with np.load(path) as z:
            data = z["data"].tobytes()
            lens = z["lens"]
            special = z["special"].astype(bool)
            meta = json.loads(z["meta"].tobytes())
        ends = np.cumsum(lens).tolist()
        starts = [0] + ends[:-1]
        token_bytes = [data[s:e] for s, e in zip(starts, ends)]
        return cls(
            token_bytes=token_bytes,
            special=special,
            special_text={int(k): v for k, v in meta["special_text"].items()},
            stop_ids=tuple(meta["stop_ids"]),
            logits_width=meta["logits_width"],
            eos_id=meta["eos_id"],
            name=meta["name"],
            key=meta["key"],
        )

    @staticmethod
    def cache_path(source_key: str) -> Path:
        from railcall.home import railcall_home

        return railcall_home() / "vocab" / f"{source_key}.npz"

    # -- builders -----------------------------------------------------------------------------

    @classmethod
    def from_hf(cls, tokenizer, *, logits_width: int | None = None, name: str | None = None, cache: bool = True) -> "Vocabulary":
        """From a transformers tokenizer or a `tokenizers.Tokenizer`, cached on disk by content."""
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        if not hasattr(backend, "to_str"):
            raise VocabularyError(
                f"{type(tokenizer).__name__} has no fast (tokenizers) backend; railcall needs the "
                "tokenizer.json form -- load it with use_fast=True"
            )
        spec = backend.to_str()
        extra_eos = _hf_eos_ids(tokenizer)
        template = getattr(tokenizer, "chat_template", None) or ""
        key = hashlib.sha256(
            (spec + json.dumps([logits_width, extra_eos, name, template is not None])).encode()
        ).hexdigest()[:24]
        vocab = None
        if cache:
            path = cls.cache_path(f"hf-{key}")
            if path.is_file():
                try:
                    vocab = cls.load(path)
                except Exception:  # a corrupt cache file is rebuilt, never trusted
                    path.unlink(missing_ok=True)
        if vocab is None:
            vocab = _vocab_from_tokenizer_json(json.loads(spec), logits_width, extra_eos, name or "hf")
            if cache:
                vocab.save(cls.cache_path(f"hf-{key}"))
        vocab.encoder = _encoder(tokenizer)
        return vocab

    @classmethod
    def from_gguf(cls, path: str | os.PathLike, *, logits_width: int | None = None, cache: bool = True) -> "Vocabulary":
        """From a GGUF file's tokenizer metadata, cached on disk. Reads only the key-value section at
        the front (railcall.gguf), so a file cut short after it -- a split GGUF's
        first part -- builds the same vocabulary as the whole file; needs neither transformers nor
        the `gguf` package."""
        from railcall.home import file_digest

        path = Path(path)
        key = f"gguf-{file_digest(path)}-{logits_width}"
        if cache:
            cpath = cls.cache_path(key)
            if cpath.is_file():
                try:
                    return cls.load(cpath)
                except Exception:
                    cpath.unlink(missing_ok=True)
        vocab = _vocab_from_gguf(path, logits_width)
        if cache:
            vocab.save(cls.cache_path(key))
        return vocab

    @classmethod
    def from_pieces(
        cls,
        pieces: Sequence[bytes | str],
        *,
        specials: Sequence[str] = (),
        stop: Sequence[str] = (),
        logits_width: int | None = None,
        name: str = "synthetic",
    ) -> "Vocabulary":
        """A vocabulary from explicit text pieces followed by special tokens (for tests)."""
        token_bytes = [p.encode() if isinstance(p, str) else bytes(p) for p in pieces]
        special = np.zeros(len(token_bytes) + len(specials), dtype=bool)
        special_text = {}
        for s in specials:
            special[len(token_bytes)] = True
            special_text[len(token_bytes)] = s
            token_bytes.append(b"")
        by_text = {v: k for k, v in special_text.items()}
        stop_ids = tuple(by_text[s] for s in stop)
        return cls(
            token_bytes=token_bytes,
            special=special,
            special_text=special_text,
            stop_ids=stop_ids,
            logits_width=logits_width or len(token_bytes),
            eos_id=stop_ids[0] if stop_ids else None,
            name=name,
        )


def _encoder(tokenizer):
    """text -> token ids without added specials, for canonical tokenization of forced text."""

    def encode(text: str) -> list[int]:
        out = tokenizer.encode(text, add_special_tokens=False)
        return list(getattr(out, "ids", out))

    return encode


def _hf_eos_ids(tokenizer) -> list[int]:
    ids = []
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.append(eos)
    elif isinstance(eos, (list, tuple)):
        ids.extend(int(i) for i in eos)
    return ids


def _decoder_kind(spec: dict) -> str:
    """'byte_level' or 'sentencepiece', from the tokenizer.json decoder and model."""

    def kinds(d) -> list[str]:
        if not d:
            return []
        if d.get("type") == "Sequence":
            return [k for sub in d.get("decoders", []) for k in kinds(sub)]
        return [d.get("type", "")]

    dec = kinds(spec.get("decoder"))
    if "ByteLevel" in dec:
        return "byte_level"
    if "ByteFallback" in dec or "Metaspace" in dec or "Replace" in dec:
        return "sentencepiece"
    pre = json.dumps(spec.get("pre_tokenizer"))
    if "ByteLevel" in pre:
        return "byte_level"
    if spec.get("model", {}).get("byte_fallback") or "Metaspace" in pre:
        return "sentencepiece"
    raise VocabularyError(
        "unsupported tokenizer: its decoder is neither byte-level BPE nor SentencePiece style "
        f"(decoder types {dec or 'none'}); railcall cannot tell which bytes each token adds"
    )


def _model_vocab(model: dict) -> list[tuple[str, int]]:
    v = model.get("vocab")
    if isinstance(v, dict):  # BPE / WordPiece: piece -> id
        return [(p, i) for p, i in v.items()]
    if isinstance(v, list):  # Unigram: [[piece, score], ...] in id order
        return [(entry[0], i) for i, entry in enumerate(v)]
    raise VocabularyError("tokenizer.json has no model.vocab")


def _vocab_from_tokenizer_json(spec: dict, logits_width: int | None, extra_eos: list[int], name: str) -> Vocabulary:
    kind = _decoder_kind(spec)
    to_bytes = byte_level_bytes if kind == "byte_level" else sentencepiece_bytes
    pieces = _model_vocab(spec["model"])
    added = spec.get("added_tokens") or []
    size = max([i for _, i in pieces] + [a["id"] for a in added]) + 1
    token_bytes: list[bytes] = [b""] * size
    special = np.zeros(size, dtype=bool)
    special_text: dict[int, str] = {}
    for piece, i in pieces:
        token_bytes[i] = to_bytes(piece)
    for a in added:
        i = a["id"]
        if a.get("special", False):
            special[i] = True
            special_text[i] = a["content"]
            token_bytes[i] = b""
        else:
            # A non-special added token is matched on the raw text, so its content is its bytes.
            token_bytes[i] = a["content"].encode("utf-8")
    return _finish(token_bytes, special, special_text, extra_eos, logits_width, name)


def _finish(token_bytes, special, special_text, eos_ids, logits_width, name) -> Vocabulary:
    by_text = {t: i for i, t in special_text.items()}
    stops = [i for i in eos_ids if 0 <= i < len(token_bytes) and special[i]]
    for n in END_OF_TURN_NAMES:
        if n in by_text and by_text[n] not in stops:
            stops.append(by_text[n])
    if not stops:
        raise VocabularyError(
            "no stop token found: the tokenizer names no EOS and none of the usual end-of-turn "
            f"tokens ({', '.join(END_OF_TURN_NAMES)}) is a special token"
        )
    return Vocabulary(
        token_bytes=token_bytes,
        special=special,
        special_text=special_text,
        stop_ids=tuple(stops),
        logits_width=max(logits_width or 0, len(token_bytes)),
        eos_id=eos_ids[0] if eos_ids else stops[0],
        name=name,
    )


def _vocab_from_gguf(path: Path, logits_width: int | None) -> Vocabulary:
    from railcall.errors import ModelError
    from railcall.gguf import BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED, read_metadata

    try:
        meta = read_metadata(path)
    except ModelError as e:
        raise VocabularyError(str(e)) from None
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise VocabularyError(f"{path} has no tokenizer.ggml.tokens metadata: the file carries no tokenizer")
    types = meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    byte_level = meta.get("tokenizer.ggml.model", "llama") == "gpt2"
    size = len(tokens)
    token_bytes: list[bytes] = [b""] * size
    special = np.zeros(size, dtype=bool)
    special_text: dict[int, str] = {}
    for i, (tok, ty) in enumerate(zip(tokens, types)):
        if ty in (CONTROL, UNKNOWN, UNUSED):
            special[i] = True
            special_text[i] = tok
        elif ty == USER_DEFINED:
            # llama.cpp keeps user-defined pieces as raw text (byte-level models included): Qwen's
            # <think> and <tool_call> are ordinary tokens whose bytes are their text
            token_bytes[i] = tok.encode("utf-8")
        elif ty == BYTE:
            token_bytes[i] = sentencepiece_bytes(tok)
        else:
            token_bytes[i] = byte_level_bytes(tok) if byte_level else sentencepiece_bytes(tok)
    eos = meta.get("tokenizer.ggml.eos_token_id")
    eos_ids = [int(eos)] if eos is not None else []
    arch = meta.get("general.architecture", "")
    width = logits_width or meta.get(f"{arch}.vocab_size") or size
    return _finish(token_bytes, special, special_text, eos_ids, int(width), path.stem)


def single_token(vocab: Vocabulary, text: str) -> int | None:
    """The id of the one token that spells `text` and decodes back to it, or None."""
    ids = vocab.encode(text)
    if ids is not None:
        candidates = ids if len(ids) == 1 else []
    else:
        sid = vocab.special_id(text)
        tid = vocab.lookup.get(text.encode("utf-8"))
        candidates = [i for i in (sid, tid) if i is not None][:1]
    for i in candidates:
        back = vocab.special_text.get(i) if vocab.is_special(i) else vocab.token_bytes[i].decode("utf-8", "replace")
        if back == text:
            return int(i)
    return None
