"""railcall.prompts.plain: a tokenizer without a chat template (a base model's) gets plain-text
turns, and a reply ends at the layout's stop strings -- before `railcall eval` would call the
reply decided with the next turn's first word still in it."""

from __future__ import annotations

from agentkit import ScriptedBackend, byte_vocab
from conftest import tiny_bpe_tokenizer
from railcall.eval import checker
from railcall.runtime.decode import SamplingParams, generate
from railcall.prompts.plain import PLAIN_TEMPLATE, STOP, is_plain, stop_strings, use_plain_template


def hf_tokenizer(**kw):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tiny_bpe_tokenizer(), **kw)


def test_a_tokenizer_without_a_template_gets_plain_turns():
    tok = hf_tokenizer(bos_token="<think>")  # any single token stands in for a BOS here
    assert not tok.chat_template and use_plain_template(tok) and is_plain(tok)
    messages = [{"role": "system", "content": "Tools: f."}, {"role": "user", "content": "Call f."},
                {"role": "assistant", "content": '{"tool":"f","args":{}}'}, {"role": "user", "content": "Again."}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == ('<think>Tools: f.\n\nQuestion: Call f.\nAnswer:\n{"tool":"f","args":{}}\n\n'
                    "Question: Again.\nAnswer:\n")
    assert stop_strings(tok) == STOP
    no_bos = hf_tokenizer()
    use_plain_template(no_bos)
    assert no_bos.apply_chat_template(messages[1:2], add_generation_prompt=True, tokenize=False) == \
        "Question: Call f.\nAnswer:\n"


def test_a_tokenizer_with_a_template_keeps_it():
    tok = hf_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert not use_plain_template(tok) and tok.chat_template != PLAIN_TEMPLATE
    assert stop_strings(tok) == () and stop_strings(None) == ()


def test_a_reply_ends_at_the_next_turn_before_it_is_decided():
    """The base model writes its call and goes on with the next turn: the stop string cuts it
    there (finish "stop", the call whole). The eval's early end of a reply that can no longer be
    a call waits while the text may still be a stop string on its way ("}\nQues")."""
    from railcall.runtime.decode import Row

    vocab = byte_vocab()
    params = SamplingParams(max_tokens=60, stop=STOP)
    for reply in ('{"tool":"f","args":{}}\nQuestion: next', '{"tool":"f","args":{}}\n\nQuestion: next', "Paris.\n\nThe"):
        g = generate(ScriptedBackend(vocab, [reply]), vocab, [0], None, params)
        assert g.finish_reason == "stop" and g.text == reply.split("\n")[0], (reply, g.text)
    decided = lambda toks: checker.decided(vocab.decode(toks).decode(), params.stop)  # noqa: E731
    for reply, reason in (('{"tool":"f","args":{}}\nQuestion: next', "stop"), ('{"tool":"f","args":{}}\nQuite', "decided")):
        row = Row(vocab, None, params, decided=decided)
        backend = ScriptedBackend(vocab, [reply])
        logits = backend.start([0])
        while feed := row.advance(logits):
            logits = backend.feed(feed)[-1]
        assert row.finish_reason == reason, (reply, row.finish_reason)
        assert row.generation().text == ('{"tool":"f","args":{}}' if reason == "stop" else '{"tool":"f","args":{}}\nQui')
    assert checker.decided('{"tool":"f","args":{}}\nQues') and not checker.decided('{"tool":"f","args":{}}\nQues', STOP)
