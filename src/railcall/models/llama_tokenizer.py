"""A GGUF's own tokenizer and chat template, through llama.cpp: what the llama.cpp backend needs of
a tokenizer, without transformers (which imports torch where torch is installed).

`LlamaTokenizer` answers the part of a Hugging Face tokenizer's interface railcall uses:
`encode`, `decode`, `apply_chat_template` (the GGUF's `tokenizer.chat_template`, rendered by
jinja2 in a sandbox the way transformers renders it: the same globals, filters and whitespace
rules, then tokenized with special tokens parsed and none added, as transformers does), and the
`chat_template`, `bos_token` and `eos_token` attributes. Token ids are llama.cpp's, which are the
GGUF's: the same ids the model was trained on (a test checks them against the tokenizer
transformers rebuilds from the same file).

Built once per model, beside its `LlamaModel`; thread-safe for encoding (llama.cpp's tokenizer
reads only the vocabulary).
"""

from __future__ import annotations

import ctypes
import json
from datetime import datetime

from railcall.errors import ModelError


class LlamaTokenizer:
    """The tokenizer of a `railcall.models.llama.LlamaModel`'s GGUF."""

    def __init__(self, model, metadata: dict):
        import llama_cpp

        self._ll = llama_cpp
        self._model = model  # keeps the weights (and the vocabulary they hold) alive
        self._vocab = llama_cpp.llama_model_get_vocab(model._model)
        tokens = metadata.get("tokenizer.ggml.tokens") or []

        def name(key: str) -> str | None:
            i = metadata.get(f"tokenizer.ggml.{key}_token_id")
            return tokens[i] if i is not None and 0 <= i < len(tokens) else None

        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))  # llama.cpp's rule, per vocabulary type
        self.bos_token = name("bos")
        self.eos_token = name("eos")
        self.pad_token = name("padding")
        self.chat_template: str | None = metadata.get("tokenizer.chat_template")
        # a template of its own for requests with tools (transformers picks it the same way)
        self.tool_template: str | None = metadata.get("tokenizer.chat_template.tool_use")
        self.name_or_path = str(model.path)
        self._template_cache: tuple[str, object] | None = None

    # -- ids ------------------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; special tokens written in it are parsed as such (as transformers
        does); a BOS is added first where the GGUF asks for one and `add_special_tokens`."""
        data = text.encode("utf-8")
        n = len(data) + 8
        while True:
            buf = (self._ll.llama_token * n)()
            got = self._ll.llama_tokenize(self._vocab, data, len(data), buf, n,
                                          bool(add_special_tokens and self.add_bos), True)
            if got >= 0:
                return list(buf[:got])
            n = -got  # too small: llama.cpp says how many it needs

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        out = bytearray()
        buf = ctypes.create_string_buffer(256)
        for t in ids:
            n = self._ll.llama_token_to_piece(self._vocab, int(t), buf, len(buf), 0, not skip_special_tokens)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = self._ll.llama_token_to_piece(self._vocab, int(t), buf, len(buf), 0, not skip_special_tokens)
            out += buf.raw[:n]
        return out.decode("utf-8", errors="replace")

    # -- chat template --------------------------------------------------------------------------

    def _template(self, tools=None):
        src = self.tool_template if tools and self.tool_template else self.chat_template
        if src is None:
            raise ModelError(f"{self.name_or_path} has no chat template (tokenizer.chat_template); "
                             "railcall gives a base model plain-text turns (railcall.prompts.plain)")
        if self._template_cache is None or self._template_cache[0] != src:
            from jinja2.ext import loopcontrols
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message):
                from jinja2.exceptions import TemplateError

                raise TemplateError(message)

            def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
                return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
            env.filters["tojson"] = tojson
            env.globals["raise_exception"] = raise_exception
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            self._template_cache = (src, env.from_string(src))
        return self._template_cache[1]

    def apply_chat_template(self, messages, tools=None, add_generation_prompt: bool = False, tokenize: bool = True,
                            **kwargs):
        """The conversation rendered by the GGUF's chat template (the tools passed as `tools`,
        as transformers passes them); its token ids, or the text with `tokenize=False`."""
        text = self._template(tools).render(messages=list(messages), tools=tools, add_generation_prompt=add_generation_prompt,
                                       bos_token=self.bos_token or "", eos_token=self.eos_token or "", **kwargs)
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def __repr__(self) -> str:
        return f"LlamaTokenizer({self.name_or_path!r})"
