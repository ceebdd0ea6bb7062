"""The live tool table: schemas read off functions, OpenAI dicts, and a grammar that follows
the table as it changes."""

from __future__ import annotations

import enum
from typing import Annotated, Literal, Optional

import pydantic
import pytest

from railcall.agent.policy import Policy, view
from railcall.agent.signature import function_schema, parse_docstring
from railcall.agent.table import ToolTable
from railcall.errors import GrammarError
from railcall.grammar.tools import tool_grammar
from railcall.matcher import Matcher, compiled_grammar


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(pydantic.BaseModel):
    x: int
    y: int = 0


class Segment(pydantic.BaseModel):
    a: Point
    b: Point


def sample(path: str, count: int, ratio: float = 0.5, loud: bool = False, mode: Literal["a", "b"] = "a",
           color: Color = Color.RED, tags: list[str] = (), note: Optional[str] = None,
           size: Annotated[int, "how many bytes"] = 1) -> str:
    """Do a sample thing.

    More detail that is not the summary.

    Args:
        path: the file to use,
            relative to the workspace.
        count: how many.

    Returns:
        a string.
    """
    return f"{path}:{count}"


def test_annotated_json_schema_keywords_join_the_type_and_reach_the_grammar():
    from railcall.agent.table import ToolTable

    def code(value: Annotated[str, "a room code", {"pattern": "^[A-D][0-9]{2}$", "maxLength": 3}]) -> str:
        return value

    _, params = function_schema(code)
    assert params["properties"]["value"] == {"type": "string", "description": "a room code",
                                             "pattern": "^[A-D][0-9]{2}$", "maxLength": 3}
    t = ToolTable()
    t.register(code)
    from railcall.agent.policy import view

    v = view(t)
    assert v.check({"tool": "code", "args": {"value": "B07"}}) == ""
    assert "do not fit" in v.check({"tool": "code", "args": {"value": "E07"}})


def test_function_schema_from_hints_and_docstring():
    desc, params = function_schema(sample)
    assert desc == "Do a sample thing."
    props = params["properties"]
    assert list(props) == ["path", "count", "ratio", "loud", "mode", "color", "tags", "note", "size"]
    assert params["required"] == ["path", "count"]
    assert props["path"] == {"type": "string", "description": "the file to use, relative to the workspace."}
    assert props["count"]["type"] == "integer" and props["ratio"] == {"type": "number", "default": 0.5}
    assert props["loud"]["type"] == "boolean" and props["mode"]["enum"] == ["a", "b"]
    assert props["color"] == {"enum": ["red", "blue"]}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["note"] == {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}
    assert props["size"]["description"] == "how many bytes"
    assert "Returns" not in str(params)


def test_pydantic_argument_schema_and_conversion():
    table = ToolTable()
    seen = []

    @table.tool()
    def plot(p: Point, color: Color, seg: Optional[Segment] = None) -> str:
        """Plot a point."""
        seen.append((p, color))
        return "ok"

    tool = table.tools()[0]
    assert tool.parameters["properties"]["p"]["properties"]["x"]["type"] == "integer"
    assert tool.parameters["$defs"]["Point"]["required"] == ["x"]  # Segment's sub-model, hoisted
    g = compiled_grammar(tool_grammar(view(table).tools), _bytes())
    m = Matcher(g)
    assert m.consume_bytes(b'{"tool":"plot","args":{"p":{"x":3,"y":4},"color":"blue"}}') and m.is_accepting()
    m = Matcher(g)
    assert m.consume_bytes(b'{"tool":"plot","args":{"p":{"x":3},"color":"red","seg":{"a":{"x":1},"b":{"x":2}}}}')
    assert m.is_accepting()
    assert not Matcher(g).consume_bytes(b'{"tool":"plot","args":{"p":{"y":3}')
    assert table.entry("plot").call({"p": {"x": 3}, "color": "red"}) == "ok"
    assert seen == [(Point(x=3, y=0), Color.RED)]


@pytest.mark.parametrize("fn, message", [
    (lambda path: None, "needs a type hint"),
    (lambda *a: None, "has no schema"),
])
def test_functions_without_a_schema_are_refused(fn, message):
    with pytest.raises(GrammarError, match=message):
        ToolTable().register(fn, name="bad")


def test_unsupported_type_names_the_argument():
    def f(x: dict[str, set]) -> str:
        return ""

    with pytest.raises(GrammarError, match="argument 'x'"):
        ToolTable().register(f)


def test_docstring_parser_tolerates_other_styles():
    assert parse_docstring("One line.") == ("One line.", {})
    assert parse_docstring("Sum.\n\nArgs:\n    a (int): first\n    b: second\n") == ("Sum.", {"a": "first", "b": "second"})


def test_openai_dict_and_duplicates_and_handler_mismatch():
    table = ToolTable()
    spec = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                            "required": ["city"]}}}
    table.add_openai(spec, lambda city: f"sunny in {city}")
    assert table.entry("get_weather").call({"city": "Oslo"}) == "sunny in Oslo"
    with pytest.raises(GrammarError, match="already in the table"):
        table.add_openai(spec, lambda city: "")
    with pytest.raises(GrammarError, match="takes no argument"):
        table.add_openai({**spec, "function": {**spec["function"], "name": "w2"}}, lambda town: "")
    with pytest.raises(GrammarError, match="domains for arguments"):
        table.add_openai({**spec, "function": {**spec["function"], "name": "w3"}}, lambda city: "",
                         domains={"town": lambda ctx: []})


def _bytes():
    from railcall.agent.policy import _byte_vocab

    return _byte_vocab()


def _spellable(table, call: bytes, policy=None) -> bool:
    m = Matcher(compiled_grammar(tool_grammar(view(table, policy).tools), _bytes()))
    return m.consume_bytes(call) and m.is_accepting()


def test_the_grammar_follows_the_table_live():
    table = ToolTable()
    table.register(sample)
    call = b'{"tool":"echo","args":{"text":"hi"}}'
    assert not _spellable(table, call)
    v0 = table.version

    def echo(text: str) -> str:
        """Echo."""
        return text

    table.register(echo)
    assert table.version == v0 + 1 and _spellable(table, call)
    table.remove("echo")
    assert not _spellable(table, call)
    with pytest.raises(KeyError):
        table.remove("echo")


def test_live_domains_are_read_at_view_time():
    items = ["a.txt"]
    table = ToolTable()

    def open_item(name: str) -> str:
        """Open an item."""
        return name

    table.register(open_item, domains={"name": lambda ctx: list(items)})
    assert _spellable(table, b'{"tool":"open_item","args":{"name":"a.txt"}}')
    assert not _spellable(table, b'{"tool":"open_item","args":{"name":"b.txt"}}')
    items.append("b.txt")
    assert _spellable(table, b'{"tool":"open_item","args":{"name":"b.txt"}}')
    items.clear()  # no value left: the tool itself is unspellable
    v = view(table, Policy())
    assert v.names == [] and "open_item" in v.left_out
