"""Vocabularies from GGUF metadata, also of a file cut short after it; and Qwen's 152k byte-level
BPE (DeepSeek-R1-Distill-Qwen-7B's GGUF, first part: metadata and no weights) read that way."""

from __future__ import annotations

import numpy as np
import pytest

from railcall.errors import ModelError, VocabularyError
from railcall.gguf import CONTROL, NORMAL, UNUSED, USER_DEFINED, read_metadata
from railcall.vocab import Vocabulary
from test_vocab_bytes import _roundtrip, varied_strings

TAGS = {"<think>": 151648, "</think>": 151649, "<tool_call>": 151657, "</tool_call>": 151658}


def small_gguf(path):
    """A byte-level GGUF with a handful of tokens, a chat template and one tensor; returns the
    byte offset where its key-values end (its tensor index starts there)."""
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "qwen2")
    w.add_tokenizer_model("gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen2")
    w.add_token_list(["a", "b", "ab", "Ġ", "<think>", "<|end|>"])
    w.add_token_types([NORMAL, NORMAL, NORMAL, NORMAL, USER_DEFINED, CONTROL])
    w.add_array("tokenizer.ggml.merges", ["a b"])
    w.add_eos_token_id(5)
    w.add_chat_template("{{ messages[0]['content'] }}")
    w.add_tensor("t", np.zeros((64, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.flush()
    kv_end = path.stat().st_size
    w.write_tensors_to_file()
    w.close()
    return kv_end


def test_a_file_cut_after_its_metadata_reads_whole(tmp_path):
    full = tmp_path / "full.gguf"
    kv_end = small_gguf(full)
    data = full.read_bytes()
    assert kv_end < len(data)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:kv_end])  # no tensor index, no tensor data
    assert read_metadata(cut) == read_metadata(full)
    v = Vocabulary.from_gguf(cut, cache=False)
    assert v.token_bytes[:5] == [b"a", b"b", b"ab", b" ", b"<think>"]
    assert v.is_special(5) and v.stop_ids == (5,) and not v.is_special(4)


def test_a_file_cut_inside_its_metadata_says_where(tmp_path):
    full = tmp_path / "full.gguf"
    kv_end = small_gguf(full)
    data = full.read_bytes()
    cut = tmp_path / "cut.gguf"
    for n in sorted({0, 3, 4, 10, 23, 24, 40, kv_end // 2, kv_end - 1}):
        cut.write_bytes(data[:n])
        with pytest.raises(ModelError, match="cut short") as e:
            read_metadata(cut)
        assert f"ends at byte {n:,}" in str(e.value)
        assert ("header" in str(e.value)) == (n < 24), n  # the header is magic, version and two counts
        with pytest.raises(VocabularyError, match="cut short"):
            Vocabulary.from_gguf(cut, cache=False)
    cut.write_bytes(data[: kv_end - 1])
    with pytest.raises(ModelError, match="'tokenizer.chat_template'"):  # the last key, written last
        read_metadata(cut)
    cut.write_bytes(b"GGUX" + data[4:])
    with pytest.raises(ModelError, match="not a GGUF file"):
        read_metadata(cut)


# -- Qwen2's 152k vocabulary ------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen2_path():
    from railcall.models.store import embedded_gguf_path

    return embedded_gguf_path("qwen2")


@pytest.mark.qwen2
def test_qwen2_metadata_from_the_first_part(qwen2_path):
    meta = read_metadata(qwen2_path)
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    assert (meta["tokenizer.ggml.model"], len(tokens)) == ("gpt2", 152064)
    assert {t: tokens.index(t) for t in TAGS} == TAGS
    assert {types[i] for i in TAGS.values()} == {USER_DEFINED}
    eos = meta["tokenizer.ggml.eos_token_id"]
    assert tokens[eos] == "<｜end▁of▁sentence｜>" and types[eos] == CONTROL
    assert "message['tool_calls']" in meta["tokenizer.chat_template"]
    # the weights are not in this part: its tensors' data would lie past its end
    assert meta["qwen2.embedding_length"] * len(tokens) // 2 > qwen2_path.stat().st_size


@pytest.mark.qwen2
def test_qwen2_cut_inside_the_token_list(qwen2_path, tmp_path):
    cut = tmp_path / "cut.gguf"
    with qwen2_path.open("rb") as f:
        cut.write_bytes(f.read(1 << 20))
    with pytest.raises(ModelError, match="'tokenizer.ggml.tokens'"):
        read_metadata(cut)


@pytest.mark.qwen2
def test_qwen2_roundtrip_against_its_own_merges(qwen2_tokenizer, qwen2_vocab):
    """The tokenizer rebuilt from the GGUF's tokens and merges encodes; railcall's vocabulary,
    read from the same file by another route, decodes every string back byte for byte."""
    strings = varied_strings()
    assert len(strings) == 200
    assert _roundtrip(qwen2_tokenizer, qwen2_vocab, strings) == []
    ids = [qwen2_tokenizer.encode(s, add_special_tokens=False) for s in strings]
    # the merges are applied: far fewer tokens than bytes
    assert sum(map(len, ids)) < 0.5 * sum(len(s.encode()) for s in strings)
    for tag, tid in TAGS.items():
        assert qwen2_tokenizer.encode("x" + tag + "y", add_special_tokens=False)[1] == tid


@pytest.mark.qwen2
def test_qwen2_tags_are_ordinary_tokens(qwen2_vocab):
    v = qwen2_vocab
    assert (v.size, v.logits_width) == (152064, 152064)
    for tag, tid in TAGS.items():
        assert not v.is_special(tid) and v.token_bytes[tid] == tag.encode() and v.lookup[tag.encode()] == tid
    assert v.stop_ids == (151643,) and v.is_special(151643) and v.token_bytes[151643] == b""
    assert v.special_id("<｜User｜>") == 151644
    pads = np.arange(151665, 152064)  # unused rows of the logits: never text
    assert v.special[pads].all() and not v.lengths[pads].any()


@pytest.mark.qwen2
def test_qwen2_gguf_builder_agrees_with_hf(qwen2_tokenizer, qwen2_vocab):
    h = Vocabulary.from_hf(qwen2_tokenizer, logits_width=152064, name="qwen2")
    n = h.size
    assert n == 151665  # the tokenizer leaves out the GGUF's unused padding rows
    assert h.token_bytes == qwen2_vocab.token_bytes[:n]
    assert (h.special == qwen2_vocab.special[:n]).all()
    assert h.stop_ids == qwen2_vocab.stop_ids and h.logits_width == qwen2_vocab.logits_width


@pytest.mark.qwen2
def test_qwen2_is_a_tokenizer_not_a_model():
    from railcall.models.store import model_folder

    with pytest.raises(ModelError, match="not a model's weights"):
        model_folder("qwen2")
