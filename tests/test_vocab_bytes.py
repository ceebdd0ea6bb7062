"""Vocabulary: every token's exact bytes, specials, stop sets, the disk cache."""

from __future__ import annotations

import random

import numpy as np
import pytest

from railcall.errors import VocabularyError
from railcall.vocab import Vocabulary, byte_level_bytes, gpt2_unicode_to_byte, sentencepiece_bytes


def varied_strings(n: int = 200, seed: int = 7) -> list[str]:
    """~200 strings mixing unicode, emoji, CJK, code, JSON with escapes, and whitespace runs."""
    pools = [
        "Hello, world!", "naïve café résumé", "Ünïcödé ß ø å", "emoji 🎉🚀👩‍💻 and flags 🇫🇷",
        "中文字符，日本語のテキスト、한국어", "Здравствуй, мир", "مرحبا بالعالم", "שלום עולם", "ελληνικά",
        "def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) { a[i] = i; }",
        '{"tool":"read_file","args":{"path":"notes/todo.txt"}}', '{"a":"\\u00e9\\n\\t\\"q\\"","b":[1,-2.5e10]}',
        "    four spaces", "\t\ttabs\t", "\n\n\nnewlines\n", "trailing   ", "   ", "\r\n", "a  b   c    d",
        "math: ∑ x² ≤ ∞, π ≈ 3.14159", "zero\u200bwidth", "combining e\u0301", "<b>html</b> &amp;",
        "`code` **bold** _it_", "C:\\path\\to\\file.txt", "https://example.com/a?b=c&d=e#f",
        "1234567890", "-0.000001e-7", "${HOME}/.cache", "😀", "\u00a0nbsp", "tab\tsep\tvalues",
    ]
    rng = random.Random(seed)
    out = list(pools)
    while len(out) < n:
        k = rng.randint(2, 4)
        out.append(rng.choice(["", " ", "\n", "  "]).join(rng.choice(pools) for _ in range(k)))
    return out[:n]


def test_gpt2_byte_map_is_a_bijection():
    m = gpt2_unicode_to_byte()
    assert sorted(m.values()) == list(range(256))
    assert byte_level_bytes("Ġhello") == b" hello"
    assert byte_level_bytes("Ċ") == b"\n"


def test_sentencepiece_pieces():
    assert sentencepiece_bytes("▁hello") == b" hello"
    assert sentencepiece_bytes("<0xE2>") == b"\xe2"
    assert sentencepiece_bytes("<0x0A>") == b"\n"


def _roundtrip(tok, vocab, strings):
    bad = []
    for s in strings:
        ids = tok.encode(s, add_special_tokens=False)
        ids = list(getattr(ids, "ids", ids))
        assert not any(vocab.special[i] for i in ids), s
        if vocab.decode(ids) != s.encode("utf-8"):
            bad.append(s)
    return bad


def test_tiny_bpe_roundtrip_and_specials(bpe_tokenizer, bpe_vocab):
    assert _roundtrip(bpe_tokenizer, bpe_vocab, varied_strings(60)) == []
    for name in ("<think>", "</think>", "<tool_call>", "</tool_call>"):
        tid = bpe_vocab.special_id(name)
        assert tid is not None and bpe_vocab.is_special(tid)
        assert bpe_vocab.token_bytes[tid] == b""
        # the tag is one token when it is the special token
        assert bpe_tokenizer.encode(name).ids == [tid]


@pytest.mark.model
def test_smollm2_roundtrip(smollm2_tokenizer, smollm2_vocab):
    strings = varied_strings()
    assert len(strings) == 200
    assert _roundtrip(smollm2_tokenizer, smollm2_vocab, strings) == []


@pytest.mark.model
def test_smollm2_specials_and_stops(smollm2_tokenizer, smollm2_vocab):
    v = smollm2_vocab
    assert v.size == 49152 and v.logits_width >= v.size
    im_end = v.special_id("<|im_end|>")
    assert im_end in v.stop_ids and v.special_id("<|endoftext|>") in v.stop_ids
    assert v.special_id("<|im_start|>") not in v.stop_ids
    for tok_text in smollm2_tokenizer.all_special_tokens:
        tid = smollm2_tokenizer.convert_tokens_to_ids(tok_text)
        assert v.is_special(tid) and v.token_bytes[tid] == b""
    # every special is excluded from text: no text index lists it
    order, _ = v.first_byte_index
    assert not np.isin(np.flatnonzero(v.special), order).any()
    # a token that is part of a UTF-8 character keeps its raw bytes (no U+FFFD)
    ids = smollm2_tokenizer.encode("🎉", add_special_tokens=False)
    assert b"".join(v.token_bytes[i] for i in ids) == "🎉".encode()
    assert all(b"\xef\xbf\xbd" not in v.token_bytes[i] for i in ids)


@pytest.mark.model
def test_smollm2_gguf_builder_agrees_with_hf(smollm2_vocab):
    from railcall.models.store import embedded_gguf_path

    g = Vocabulary.from_gguf(embedded_gguf_path("smollm2"))
    assert g.token_bytes == smollm2_vocab.token_bytes
    assert (g.special == smollm2_vocab.special).all()
    assert set(g.stop_ids) == set(smollm2_vocab.stop_ids)


@pytest.mark.gemma
def test_gemma3_roundtrip_specials_and_stops(gemma3_tokenizer, gemma3_vocab):
    v = gemma3_vocab
    assert v.size == 262144
    assert _roundtrip(gemma3_tokenizer, v, varied_strings()) == []
    assert {v.token_text(i) for i in v.stop_ids} == {"<eos>", "<end_of_turn>"}
    assert v.is_special(v.special_id("<start_of_turn>"))
    # byte-fallback pieces are single raw bytes
    fallback = [i for i in range(v.size) if not v.special[i] and len(v.token_bytes[i]) == 1 and v.token_bytes[i][0] >= 0x80]
    assert len(fallback) >= 128
    # non-special added pieces (whitespace runs) are text
    nl = gemma3_tokenizer.encode("\n\n", add_special_tokens=False)
    assert v.decode(nl) == b"\n\n" and not any(v.special[i] for i in nl)


@pytest.mark.gemma
def test_gemma3_gguf_builder_agrees_with_hf(gemma3_vocab):
    from railcall.models.store import embedded_gguf_path

    g = Vocabulary.from_gguf(embedded_gguf_path("gemma3"))
    assert g.token_bytes == gemma3_vocab.token_bytes
    assert (g.special == gemma3_vocab.special).all()
    assert set(g.stop_ids) == set(gemma3_vocab.stop_ids)


def test_disk_cache_roundtrip(tmp_path, monkeypatch, bpe_tokenizer):
    monkeypatch.setenv("RAILCALL_HOME", str(tmp_path))
    built = Vocabulary.from_hf(bpe_tokenizer)
    files = list((tmp_path / "vocab").glob("*.npz"))
    assert len(files) == 1
    again = Vocabulary.from_hf(bpe_tokenizer)
    assert again.token_bytes == built.token_bytes and again.key == built.key
    assert (again.special == built.special).all() and again.stop_ids == built.stop_ids
    # a corrupt cache file is rebuilt, not trusted
    files[0].write_bytes(b"not a zip")
    rebuilt = Vocabulary.from_hf(bpe_tokenizer)
    assert rebuilt.token_bytes == built.token_bytes


def test_indexes(bytes_vocab):
    v = bytes_vocab
    order, offsets = v.first_byte_index
    for b in (ord("{"), ord('"'), 0xF0):
        ids = order[offsets[b]:offsets[b + 1]]
        assert all(v.token_bytes[i][0] == b for i in ids)
    B = v.byte_matrix
    assert B.shape == (v.max_token_len, v.size)
    tid = v.lookup[b'"}}']
    assert bytes(B[:3, tid]) == b'"}}'
    assert v.has_extension(b'"}') and not v.has_extension(b'"}}')
    assert v.greedy_tokenize(b'{"tool":"') == [v.lookup[b'{"'], v.lookup[b"tool"], v.lookup[b'":"']]


def test_bad_vocabularies():
    with pytest.raises(VocabularyError, match="stop id"):
        Vocabulary(token_bytes=[b"a"], special=np.zeros(1, bool), special_text={}, stop_ids=(3,), logits_width=1)
    with pytest.raises(VocabularyError, match="logits width"):
        Vocabulary(token_bytes=[b"a", b"b"], special=np.zeros(2, bool), special_text={}, stop_ids=(), logits_width=1)
