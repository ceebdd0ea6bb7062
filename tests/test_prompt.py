"""Chat prompts: the model's own tool template where it has one, a system message otherwise."""

import pytest

from railcall.demo import DEMO_TOOLS
from railcall.grammar.tools import Tool
from railcall.prompts.chat import chat_prompt_ids, has_native_tools, system_prompt


class FakeTokenizer:
    def __init__(self, template):
        self.chat_template = template
        self.calls = []

    def apply_chat_template(self, messages, **kw):
        self.calls.append((messages, kw))
        return [1, 2, 3]


def test_native_tool_template_gets_the_tools():
    tok = FakeTokenizer("{% for tool in tools %}{{ tool }}{% endfor %}")
    assert has_native_tools(tok)
    assert chat_prompt_ids(tok, DEMO_TOOLS, "hi") == [1, 2, 3]
    messages, kw = tok.calls[0]
    assert [t["function"]["name"] for t in kw["tools"]] == [t.name for t in DEMO_TOOLS]
    assert messages == [{"role": "user", "content": "hi"}]


def test_no_tool_template_gets_a_system_message():
    tok = FakeTokenizer("{% for message in messages %}{{ message['content'] }}{% endfor %}")
    assert not has_native_tools(tok)
    chat_prompt_ids(tok, DEMO_TOOLS, "hi")
    messages, kw = tok.calls[0]
    assert "tools" not in kw and messages[0]["role"] == "system"
    assert all(t.name in messages[0]["content"] for t in DEMO_TOOLS)
    assert '{"tool":"<tool name>"' in system_prompt(DEMO_TOOLS)


# -- on DeepSeek-R1-Distill-Qwen's tokenizer and chat template ---------------------------------

# A template that renders tools, in the shape of Qwen 2.5's (shortened).
TOOLS_TEMPLATE = ("{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>{% endif %}"
                  "{% for m in messages %}<｜{{ m['role'] }}｜>{{ m['content'] }}{% endfor %}<｜Assistant｜>")


@pytest.mark.qwen2
def test_deepseek_r1_template_lists_no_tools_so_railcall_writes_them(qwen2_tokenizer):
    """The template renders calls and tool results in history, but no tool list: railcall's
    system prompt carries the tools, placed by the template after its BOS."""
    tok = qwen2_tokenizer
    assert "message['tool_calls']" in tok.chat_template and not has_native_tools(tok)
    ids = chat_prompt_ids(tok, DEMO_TOOLS, "hi")
    assert tok.decode(ids) == "<｜begin▁of▁sentence｜>" + system_prompt(DEMO_TOOLS) + "<｜User｜>hi<｜Assistant｜>"
    assert ids[0] == tok.convert_tokens_to_ids("<｜begin▁of▁sentence｜>") == 151646
    assert ids[-1] == tok.convert_tokens_to_ids("<｜Assistant｜>") == 151645
    body = ids[1:-3]  # the system prompt: ordinary tokens only, none a tag
    assert body and max(body) < 151643


@pytest.mark.qwen2
def test_a_template_that_renders_tools_gets_them_on_qwen2(qwen2_tokenizer):
    import copy

    tok = copy.copy(qwen2_tokenizer)
    tok.chat_template = TOOLS_TEMPLATE
    assert has_native_tools(tok) and not has_native_tools(qwen2_tokenizer)  # the copy alone changed
    text = tok.decode(chat_prompt_ids(tok, DEMO_TOOLS, "hi"))
    assert text.startswith("<tools>") and text.endswith("<｜user｜>hi<｜Assistant｜>")
    for t in DEMO_TOOLS:
        assert '"name": "%s"' % t.name in text
    assert "You are an assistant" not in text


# -- the call format in the prompt: a skeleton and one example built from the table ----------

TYPED = [Tool("book", "Book a table.", {"type": "object", "properties": {
    "place": {"type": "string"}, "people": {"type": "integer"}, "price": {"type": "number"},
    "terrace": {"type": "boolean"}, "dishes": {"type": "array"}, "mood": {"enum": ["calm", "loud"]},
    "note": {"type": "string"}}, "required": ["place", "people", "price", "terrace", "dishes", "mood"]}),
    Tool("cancel")]


@pytest.mark.parametrize("fmt, example", [
    ("json", '{"tool":"book","args":{"place":"<place>","people":0,"price":0.0,"terrace":false,"dishes":[],"mood":"calm"}}'),
    ("openai", '{"name":"book","arguments":{"place":"<place>","people":0,"price":0.0,"terrace":false,"dishes":[],"mood":"calm"}}'),
    ("hermes", '<tool_call>{"name":"book","arguments":{"place":"<place>","people":0,"price":0.0,"terrace":false,'
               '"dishes":[],"mood":"calm"}}</tool_call>'),
    ("pythonic", '[book(place="<place>", people=0, price=0.0, terrace=False, dishes=[], mood="calm")]'),
])
def test_the_example_is_the_first_tool_with_placeholders_of_each_type(fmt, example):
    from railcall.prompts.chat import call_example, skeleton

    assert call_example(TYPED, fmt) == example  # required arguments only: `note` is left out
    assert skeleton(fmt, quoted=True) in system_prompt(TYPED, fmt)
    assert example not in system_prompt(TYPED, fmt)  # off by default (measured: the model copies it)
    assert example in system_prompt(TYPED, fmt, example=True)


def test_the_json_prompt_is_the_one_measured():
    assert system_prompt(DEMO_TOOLS).endswith(
        'Choose the tool that fits the request and answer with exactly one JSON object and nothing '
        'else: {"tool":"<tool name>","args":{"<argument>":"<value>"}}')


@pytest.mark.parametrize("fmt", ["json", "openai", "hermes", "pythonic"])
def test_the_example_is_a_call_the_grammar_spells(fmt):
    """The prompt never shows what the grammar would refuse (the Hermes tags as text: this
    vocabulary has no token for them)."""
    from agentkit import byte_vocab
    from railcall.grammar.tools import tool_grammar
    from railcall.matcher import Matcher, compiled_grammar
    from railcall.prompts.chat import call_example

    m = Matcher(compiled_grammar(tool_grammar(TYPED, fmt), byte_vocab()))
    assert m.consume_bytes(call_example(TYPED, fmt).encode()) and m.is_accepting()


@pytest.mark.parametrize("purpose, opening, listing", [
    ("call", "acts by calling one tool", "- f: Do f. Arguments: x (integer), c (string, optional)."),
    ("server", "can act by calling tools", "- f: Do f. Arguments: x (integer), c (string, optional)."),
    ("agent", "step by step", '- f: Do f. Arguments: x (integer), c (one of "a", "b").'),
    ("bfcl", "can call tools", "    x (integer, required): the x"),
])
def test_one_system_prompt_for_every_surface(purpose, opening, listing):
    """The demo's, the server's, the agent's and BFCL's system prompts come from one function:
    each its own opening and tool-list detail, every one with the format's skeleton."""
    from railcall.prompts.chat import skeleton

    tools = [Tool("f", "Do f.", {"type": "object", "properties": {"x": {"type": "integer", "description": "the x"},
                                                                  "c": {"type": "string", "enum": ["a", "b"]}},
                                 "required": ["x"]})]
    text = system_prompt(tools, "hermes", purpose=purpose)
    assert opening in text.splitlines()[0] and listing in text.splitlines()
    assert skeleton("hermes", quoted=purpose != "bfcl") in text
    with pytest.raises(ValueError, match="unknown purpose"):
        system_prompt(tools, purpose="chat")
