"""The server on Qwen's 152k vocabulary and DeepSeek-R1-Distill's chat template, through the
official `openai` client, streaming and not.

The backend is a test double, said plainly: there are no weights (the package holds the GGUF's
metadata only), so a scripted backend puts the highest logit on the next token of a given
script. The grammar's mask still decides every token: a scripted token it forbids is never
written, and the assertions on the output would fail.

Two templates: the model's own, which renders no tool list (railcall writes its system prompt
and its JSON call format), and one that renders tools (as Qwen 2.5's does), where the calls are
Hermes blocks opened by the `<tool_call>` token, 151657.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from output_script import ScriptedIds
from server_harness import TOOLS

pytestmark = pytest.mark.qwen2

THINK, UNTHINK, CALL, UNCALL, EOS = 151648, 151649, 151657, 151658, 151643
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# A template that renders tools (the shape of Qwen 2.5's, shortened), for the Hermes format.
TOOLS_TEMPLATE = ("{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>{% endif %}"
                  "{% for m in messages %}<｜{{ m['role'] }}｜>{{ m['content'] }}{% endfor %}<｜Assistant｜>")


class ScriptedBackend(ScriptedIds):
    """Emits the next scripted turn: each row of logits prefers the script's next token."""

    def __init__(self, width: int):
        self.width, self.turns, self.prompts = width, [], []
        self.script, self.pos = [], 0

    def _row(self):
        row = torch.zeros(self.width)
        row[self.script[self.pos] if self.pos < len(self.script) else EOS] = 10.0
        return row

    def start(self, prompt):
        self.prompts.append(list(prompt))
        self.script = self.turns.pop(0)
        return super().start(prompt)


@pytest.fixture(scope="module", params=["own template", "tools template"])
def server(request, qwen2_tokenizer):
    import copy

    from railcall.server.app import start_in_thread
    from railcall.server.model import ServedModel
    from railcall.vocab import Vocabulary

    tok = qwen2_tokenizer
    if request.param == "tools template":
        tok = copy.copy(qwen2_tokenizer)
        tok.chat_template = TOOLS_TEMPLATE
    vocab = Vocabulary.from_hf(tok, logits_width=152064, name="qwen2")
    backend = ScriptedBackend(vocab.logits_width)
    lm = SimpleNamespace(tokenizer=tok, name="deepseek-r1-distill-qwen",
                         model=SimpleNamespace(config=SimpleNamespace(max_position_embeddings=131072, vocab_size=152064)))
    served = ServedModel(lm, vocab)
    served.serve_one_at_a_time(backend)
    run = start_in_thread(served=served, api_key="k")
    import openai

    client = openai.OpenAI(api_key="k", base_url=run.url + "/v1", max_retries=0, timeout=60)
    yield SimpleNamespace(client=client, served=served, backend=backend, tok=tok)
    run.stop()


def turn(s, call: dict) -> list[int]:
    """Reasoning (with a `</think>` spelled in pieces inside it), a short content, then the call in
    the served format, as token ids of this tokenizer."""
    enc = lambda text: s.tok.encode(text, add_special_tokens=False)  # noqa: E731
    spelled = enc("Paris: use the tool. A </") + enc("think> here is text.")
    assert UNTHINK not in spelled
    ids = [THINK] + spelled + [UNTHINK] + enc("Checking.")
    if s.served.call_format == "hermes":
        body = json.dumps({"name": call["name"], "arguments": call["args"]}, separators=(",", ":"))
        return ids + [CALL] + enc(body) + [UNCALL, EOS]
    body = json.dumps({"tool": call["name"], "args": call["args"]}, separators=(",", ":"))
    return ids + enc(" " + body) + [EOS]


def test_the_format_follows_the_template(server):
    s = server.served
    assert s.reasoning and [d.token_id for d in s.delimiters.all()] == [THINK, UNTHINK, CALL, UNCALL]
    native = s.tokenizer.chat_template == TOOLS_TEMPLATE
    assert (s.native, s.call_format, s.keys) == ((True, "hermes", ("name", "arguments")) if native
                                                 else (False, "json", ("tool", "args")))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_reasoning_and_a_tool_call(server, stream):
    call = {"name": "get_weather", "args": {"city": "Paris"}}
    server.backend.turns.append(turn(server, call))
    kw = dict(model="deepseek-r1-distill-qwen", messages=ASK, tools=TOOLS, temperature=0, max_tokens=80)
    if not stream:
        msg = server.client.chat.completions.create(**kw).choices[0].message
        reasoning, content, calls = msg.reasoning_content, msg.content, msg.tool_calls
        got = [(c.function.name, json.loads(c.function.arguments)) for c in calls]
    else:
        reasoning = content = ""
        parts: dict[int, list[str]] = {}  # the call arrives in pieces: the name, then argument text
        for chunk in server.client.chat.completions.create(stream=True, **kw):
            if not chunk.choices:
                continue
            d = chunk.choices[0].delta
            reasoning += getattr(d, "reasoning_content", None) or ""
            content += d.content or ""
            for c in d.tool_calls or []:
                name, args = parts.setdefault(c.index, ["", ""])
                parts[c.index] = [name + (c.function.name or ""), args + (c.function.arguments or "")]
        got = [(name, json.loads(args)) for name, args in (parts[k] for k in sorted(parts))]
    assert reasoning == "Paris: use the tool. A </think> here is text."
    assert content.strip() == "Checking."
    assert got == [("get_weather", {"city": "Paris"})]
    prompt = server.tok.decode(server.backend.prompts[-1])
    if server.served.native:  # the template rendered the tools
        assert '"name": "get_weather"' in prompt and "You are an assistant" not in prompt
    else:  # railcall's system prompt, after the template's BOS
        assert prompt.startswith("<｜begin▁of▁sentence｜>You are an assistant that can act by calling tools.")
        assert "get_weather: Current weather for a city." in prompt and prompt.endswith("<｜Assistant｜>")


def test_a_call_tag_spelled_in_pieces_is_content(server):
    """With tool_choice auto, only the call-open token 151657 (or, in the JSON format, its trigger
    text) starts a call; a `<tool_call>` spelled in pieces is content."""
    enc = lambda text: server.tok.encode(text, add_special_tokens=False)  # noqa: E731
    ids = [THINK] + enc("no tool") + [UNTHINK] + enc("Write <") + enc("tool_call> to call one.") + [EOS]
    assert CALL not in ids
    server.backend.turns.append(ids)
    msg = server.client.chat.completions.create(model="deepseek-r1-distill-qwen", messages=ASK, tools=TOOLS, temperature=0,
                                                max_tokens=40).choices[0].message
    assert (msg.reasoning_content, msg.content, msg.tool_calls) == ("no tool", "Write <tool_call> to call one.", None)
