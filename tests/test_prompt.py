"""Chat prompts: the model's own tool template where it has one, a system message otherwise."""

from railcall.demo import DEMO_TOOLS
from railcall.prompt import chat_prompt_ids, has_native_tools, system_prompt


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
