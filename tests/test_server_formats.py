"""The request's call format and routing, through the official `openai` client: tool calls come
back right in each of the four formats, whole and streamed, with greedy and scored routing.

The backend is a test double, said plainly: SmolLM2's tokenizer without its weights, and logits
that prefer every token spelling what comes next in the scripted reply (the text written so far
is tracked, so forced tokens keep it in step; a name scored in SmolLM2's own tokens is as likely
as spelled byte by byte). The grammar's mask still decides every token."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from server_harness import TOOLS

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
REPLIES = {
    "json": '{"tool":"get_weather","args":{"city":"Paris"}}',
    "openai": '{"name":"get_weather","arguments":{"city":"Paris"}}',
    "hermes": '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>',
    "pythonic": '[get_weather(city="Paris")]',
}


class ScriptedText:
    """Each start() takes the next scripted reply; each row of logits prefers the tokens that
    spell its next bytes, else the stop token. `Scoring` can score branches too."""

    def __init__(self, vocab):
        self.vocab, self.width = vocab, vocab.logits_width
        self.replies: list[bytes] = []
        self.prompts: list[list[int]] = []
        self.target = self.written = b""
        self.branches = 0

    def start(self, prompt):
        self.prompts.append(list(prompt))
        self.target, self.written = self.replies.pop(0), b""
        return self._row()

    def feed(self, tokens):
        rows = []
        for t in tokens:
            self.written += self.vocab.token_bytes[t]
            rows.append(self._row())
        return torch.stack(rows)

    def _row(self):
        row = torch.full((self.width,), -5.0)
        n = len(self.written)
        if self.target.startswith(self.written) and n < len(self.target):
            for k in range(1, min(len(self.target) - n, 16) + 1):  # every token that spells what comes next
                t = self.vocab.lookup.get(self.target[n:n + k])
                if t is not None:
                    row[t] = 10.0
        else:
            row[self.vocab.stop_ids[0]] = 10.0
        return row


class Scoring(ScriptedText):
    def branch_logits(self, branches):
        self.branches += 1
        out, before = [], self.written
        for b in branches:
            rows = []
            for t in b:
                self.written += self.vocab.token_bytes[t]
                rows.append(self._row())
            out.append(torch.stack(rows))
            self.written = before
        return out


def serve(smollm2_tokenizer, backend_cls):
    from railcall.server.app import start_in_thread
    from railcall.server.model import ServedModel
    from railcall.vocab import Vocabulary

    tok = smollm2_tokenizer
    vocab = Vocabulary.from_hf(tok, name="smollm2")
    backend = backend_cls(vocab)
    lm = SimpleNamespace(tokenizer=tok, name="smollm2-scripted",
                         model=SimpleNamespace(config=SimpleNamespace(max_position_embeddings=8192, vocab_size=vocab.logits_width)))
    served = ServedModel(lm, vocab)
    served.serve_one_at_a_time(backend)
    run = start_in_thread(served=served, api_key="k")
    import openai

    client = openai.OpenAI(api_key="k", base_url=run.url + "/v1", max_retries=0, timeout=60)
    return SimpleNamespace(client=client, served=served, backend=backend, tok=tok, run=run)


@pytest.fixture(scope="module")
def server(smollm2_tokenizer):
    s = serve(smollm2_tokenizer, Scoring)
    yield s
    s.run.stop()


def ask(s, fmt, stream, routing="greedy", choice="required"):
    s.backend.replies.append(REPLIES[fmt].encode())
    kw = dict(model="smollm2-scripted", messages=ASK, tools=TOOLS, temperature=0, max_tokens=60, tool_choice=choice,
              parallel_tool_calls=False,
              extra_body={"call_format": fmt, "routing": routing})
    if not stream:
        msg = s.client.chat.completions.create(**kw).choices[0].message
        return [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls or []], msg.content
    parts: dict[int, list[str]] = {}
    content = ""
    for chunk in s.client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        content += d.content or ""
        for c in d.tool_calls or []:
            name, args = parts.setdefault(c.index, ["", ""])
            parts[c.index] = [name + (c.function.name or ""), args + (c.function.arguments or "")]
    return [(name, json.loads(args)) for name, args in (parts[k] for k in sorted(parts))], content or None


@pytest.mark.parametrize("routing", ["greedy", "scored"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("fmt", list(REPLIES))
def test_tool_calls_come_back_in_each_format(server, fmt, stream, routing):
    before = server.backend.branches
    calls, content = ask(server, fmt, stream, routing)
    assert calls == [("get_weather", {"city": "Paris"})]
    assert not (content or "").strip()
    assert server.backend.branches == before + (routing == "scored")  # one scoring pass for the call
    from railcall.prompts.chat import skeleton

    prompt = server.tok.decode(server.backend.prompts[-1])
    assert skeleton(fmt, quoted=True) in prompt  # the prompt asks for the format the grammar enforces


@pytest.mark.parametrize("fmt", ["openai", "hermes", "pythonic"])
def test_tool_choice_auto_in_each_format(server, fmt):
    calls, _ = ask(server, fmt, False, choice="auto")
    assert calls == [("get_weather", {"city": "Paris"})]


def test_an_unknown_call_format_or_routing_is_a_400_that_names_it(server):
    import openai

    for field, value in (("call_format", "xml"), ("routing", "best")):
        with pytest.raises(openai.BadRequestError) as e:
            server.client.chat.completions.create(model="smollm2-scripted", messages=ASK, tools=TOOLS, extra_body={field: value})
        assert field in str(e.value)


def test_scored_routing_without_a_scoring_backend_is_a_400(smollm2_tokenizer):
    import openai

    s = serve(smollm2_tokenizer, ScriptedText)
    try:
        with pytest.raises(openai.BadRequestError) as e:
            s.client.chat.completions.create(model="smollm2-scripted", messages=ASK, tools=TOOLS, extra_body={"routing": "scored"})
        assert e.value.body["code"] == "unsupported_field" and e.value.body["param"] == "routing"
    finally:
        s.run.stop()


TIMER = [{"type": "function", "function": {"name": "set_timer", "parameters": {
    "type": "object", "properties": {"minutes": {"type": "integer"}}, "required": ["minutes"]}}}]


def timers(s, text, reply, values, parallel=False, before=()):
    s.backend.replies.append(reply.encode())
    msg = s.client.chat.completions.create(
        model="smollm2-scripted", messages=[*before, {"role": "user", "content": text}], tools=TIMER, temperature=0, max_tokens=60,
        tool_choice="required", parallel_tool_calls=parallel, extra_body={"values": values}).choices[0].message
    return [json.loads(c.function.arguments)["minutes"] for c in msg.tool_calls]


def test_grounded_values_write_the_requests_numbers_and_fill_a_call_each(server):
    """A model that would write 52 for "25 minutes" writes 25 under values "grounded" (the only
    number the message states); "for 5 and 10 minutes" with parallel calls is two calls, 5 then
    10, where the model would have stopped after one."""
    one = '{"tool":"set_timer","args":{"minutes":52}}'
    assert timers(server, "Set a timer for 25 minutes", one, "free") == [52]
    assert timers(server, "Set a timer for 25 minutes", one, "grounded") == [25]
    five = '[{"tool":"set_timer","args":{"minutes":5}}]'
    assert timers(server, "Set timers for 5 and 10 minutes", five, "free", parallel=True) == [5]
    assert timers(server, "Set timers for 5 and 10 minutes", five, "grounded", parallel=True) == [5, 10]
    # a number from an earlier turn or a tool result is writable, and counts no call
    said = [{"role": "user", "content": "My tea needs 4 minutes."}, {"role": "assistant", "content": "Noted."}]
    forty, four = ('{"tool":"set_timer","args":{"minutes":%d}}' % n for n in (40, 4))
    assert timers(server, "Set a timer for my tea", forty, "free", before=said) == [40]
    assert timers(server, "Set a timer for my tea", forty, "grounded", before=said) == [4]
    assert timers(server, "Set a timer for my tea", f"[{four}]", "grounded", parallel=True, before=said) == [4]
    assert timers(server, "Set a timer for 25 minutes", four, "grounded", before=said) == [4]
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        server.client.chat.completions.create(model="smollm2-scripted", messages=ASK, tools=TOOLS, extra_body={"values": "exact"})
    assert "values" in str(e.value)


def test_matched_routing_prefers_the_tools_the_message_names(server):
    """routing "matched": the row's router chooses among the tools whose words the last user
    message shares most (calc for "evaluate this arithmetic expression"), and a request whose
    words name no tool leaves the choice to the model's whole-name scores."""
    from railcall.server.plan import build_plan
    from railcall.server.schemas import ChatCompletionRequest

    def router(text):
        req = ChatCompletionRequest(model="smollm2-scripted", messages=[{"role": "user", "content": text}], tools=TOOLS,
                                    tool_choice="required", routing="matched")
        return build_plan(server.served, req).router(server.served)

    assert router("Please evaluate this arithmetic expression: 2+3").prefer == {"calc"}
    assert router("Is it raining in Paris?").prefer == frozenset()
    calls, _ = ask(server, "json", False, routing="matched")  # "What is the weather in Paris?"
    assert calls == [("get_weather", {"city": "Paris"})]
