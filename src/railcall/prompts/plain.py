"""The prompt of a model without a chat template (a base model, such as the embedded Gemma 3
270M): the turns as plain text, and the stop strings that end the model's turn.

    <bos>You are an assistant that can call tools. Tools:        the system message
    - get_weather: ...

    Question: What is the weather in Paris?                      earlier turns (in-context
    Answer:                                                      examples, an agent's steps)
    {"tool":"get_weather","args":{"city":"Paris"}}

    Question: And in Tokyo?
    Answer:
                                                                 <- the model writes from here

Question and Answer, because that read best of the layouts tried: on Gemma 3 270M, asked
"What is the capital of France?", it answers "The capital of France is Paris." after `Answer:`,
where after `User:` ... `Assistant:` it wrote the question again, and without the grammar it
answered the first BFCL tasks in sentences where under `Assistant:` it copied the tool list.
The reply starts on the line after "Answer:": a call then begins with "{" (or "[" or "<") as a
token of its own, which the grammar allows, where "Answer: {" would make the model's likeliest
first token " {" (space included), which no call format's grammar does. A base model does not
end its turn with a stop token; it goes on to write the next turn. So a reply ends at a blank
line or at a line starting "Question" (`STOP`); a turn of several paragraphs is cut after the
first, the price of a layout any base model reads. Under the grammar a call ends itself; the
stop strings end free text (a reply without the grammar, the text around a call under
tool_choice "auto").

`use_plain_template(tokenizer)` installs the layout as the tokenizer's chat template where it has
none (`railcall.models.store.load_model` does it on load), so every prompt builder -- eval, demo,
agent, server -- renders through the same `apply_chat_template`; `stop_strings(tokenizer)` is
`STOP` for such a tokenizer and () for any other.
"""

from __future__ import annotations

MARK = "railcall plain layout 2"  # a Jinja comment: says a template is this one

# Roles other than system, user and assistant (a tool result) are shown as "Result:" lines.
PLAIN_TEMPLATE = (
    "{#- " + MARK + " -#}"
    "{%- if bos_token %}{{ bos_token }}{% endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}{{ m['content'] }}{{ '\\n\\n' }}"
    "{%- elif m['role'] == 'user' -%}Question: {{ m['content'] }}{{ '\\n' }}"
    "{%- elif m['role'] == 'assistant' -%}Answer:{{ '\\n' }}{{ m['content'] }}{{ '\\n\\n' }}"
    "{%- else -%}Result: {{ m['content'] }}{{ '\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}Answer:{{ '\\n' }}{%- endif -%}"
)
# "\nQuestion" rather than "\nQuestion:": the colon may come as a token of its own, and a reply
# that goes on after a complete call is ended as soon as the next word starts (railcall eval).
STOP = ("\n\n", "\nQuestion")


def has_chat_template(tokenizer) -> bool:
    template = getattr(tokenizer, "chat_template", None)
    return bool(template)


def use_plain_template(tokenizer) -> bool:
    """Give a tokenizer without a chat template the plain layout; True if it now has it."""
    if not has_chat_template(tokenizer):
        tokenizer.chat_template = PLAIN_TEMPLATE
    return is_plain(tokenizer)


def is_plain(tokenizer) -> bool:
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and MARK in template


def stop_strings(tokenizer) -> tuple[str, ...]:
    """The stop strings a reply needs under this tokenizer's prompt layout."""
    return STOP if is_plain(tokenizer) else ()
