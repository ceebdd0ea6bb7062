"""Output: a model's generated tokens -> reasoning_content, content and tool calls, as deltas.

Two pieces, with different lifecycles:

- `Delimiters` (once per model): the model contract's reasoning open/close and tool-call
  open/close strings, each resolved against the vocabulary to the one token that spells it, or
  to None when no such token exists. The output parser and the grammar regions
  (`railcall.runtime.regions`) read the same object, so they can never disagree on what ends reasoning.
- `OutputParser` (once per request): fed one generated token at a time, as its id and then its
  text, it returns deltas and, at the end, a `ParsedOutput`.

The rule: a delimiter that is one token counts only where that token was generated.
A model that writes `</think>` as ordinary text -- explaining a chat template, or inside a JSON
string -- produces pieces such as `</`, `think`, `>`; those stay text, in reasoning_content or
content, wherever they occur. The parser learns from the token id *where* the delimiter's text
will start (the offset in the decoded text when the id arrives) and switches mode exactly there;
text that could still become that delimiter is held until its text arrives. At `finish()` held
text is released as ordinary text; `cancel()` (a cancelled or failed request) discards it.

The fallback, and its limit: a delimiter that is not one token (SmolLM2 has no `<think>` token;
it spells it `<`, `think`, `>`) can only be recognised by its text, so there a spelled tag does
switch modes -- the behaviour this module exists to avoid, kept because nothing better is
knowable from text. docs/reasoning.md lists which delimiters resolve on the embedded model.

Call formats (railcall.grammar.tools):
- Hermes, `<tool_call>{"name":…,"arguments":{…}}</tool_call>`: a call starts at the open
  delimiter (token, or text where it is not one token) and ends at the close delimiter once the
  body is a complete JSON value, so a close tag written inside an argument string stays argument
  text. Several calls in one turn (parallel) are simply several such blocks.
- JSON wire format, `{"tool":"<name>","args":{…}}`: no vocabulary has a token for it, so calls
  are recognised by text. With tool_choice "required" the content *is* the call: content that
  starts with `{` or `[` is scanned as one JSON value (an object, or an array of objects for
  parallel calls). With "auto", the trigger text `{"tool":"` anywhere in content starts a call,
  which ends where its JSON object closes; further triggers are further calls. These are the
  same texts `railcall.runtime.regions` hands to the call grammar, so grammar and parser agree.
- OpenAI-style `{"name":…,"arguments":{…}}`: read as the JSON wire format, with its own keys
  and trigger text `{"name":"`.
- Pythonic, `[get_weather(city="Paris", days=3)]`: content that starts with `[` (after
  whitespace; with "auto" as with "required", as vLLM's pythonic parser reads it) is read as one
  Python list of calls, to its closing bracket. It is parsed with `ast.parse`, never evaluated:
  each item must be a call of a (dotted) name with keyword arguments only, each value a literal
  (strings, numbers, True/False/None, lists, dicts with string keys); the arguments become JSON
  text, numbers as written where JSON spells them alike. With `stream_calls` its calls are
  handed out when the list closes (name, arguments, call), not piece by piece.
A call body that does not parse as a call of its format is returned as content, verbatim.
"""


from railcall.output.calls import Delta, ParsedOutput, ToolCall, parse_pythonic
from railcall.output.delimiters import (AUTO_TRIGGERS, CALL_FORMATS, JSON_CALL_TRIGGER, JSON_FORMATS, ROLES,
                                        Delimiter, Delimiters, TextTrigger, json_gaps)
from railcall.output.parser import OutputParser

__all__ = ["AUTO_TRIGGERS", "CALL_FORMATS", "JSON_CALL_TRIGGER", "JSON_FORMATS", "ROLES", "Delimiter", "Delimiters",
           "Delta", "OutputParser", "ParsedOutput", "TextTrigger", "ToolCall", "json_gaps", "parse_pythonic"]
