"""The batch the vLLM tests run: nine requests with different tool tables (one of them the
read-only view of a table with mutating tools), one JSON Schema answer and one request without
railcall, on the embedded SmolLM2."""

from __future__ import annotations

from railcall.demo import DEMO_TOOLS
from railcall.grammar.tools import Tool, read_only_view
from railcall.prompts.chat import chat_prompt_ids

MAX_TOKENS = 64


def _obj(required=(), **props):
    return {"type": "object", "properties": props, "required": list(required)}


S = {"type": "string"}

EMAIL = [
    Tool("send_email", "Send an email.", _obj(["to", "subject", "body"], to=S, subject=S, body=S), mutates=True),
    Tool("search_contacts", "Find a contact by name.", _obj(["query"], query=S)),
]
WEATHER = [Tool("get_weather", "Current weather in a city.",
                _obj(["city", "unit"], city=S, unit={"type": "string", "enum": ["celsius", "fahrenheit"]}))]
CALENDAR = [
    Tool("create_event", "Put an event in the calendar.",
         _obj(["title", "date", "minutes"], title=S, date=S, minutes={"type": "integer", "minimum": 1, "maximum": 480}),
         mutates=True),
    Tool("list_events", "List the events of a day.", _obj(["date"], date=S)),
]
MATH = [
    Tool("add", "Add two numbers.", _obj(["a", "b"], a={"type": "number"}, b={"type": "number"})),
    Tool("multiply", "Multiply two numbers.", _obj(["a", "b"], a={"type": "number"}, b={"type": "number"})),
]
SEARCH = [
    Tool("web_search", "Search the web.", _obj(["query"], query=S, max_results={"type": "integer", "minimum": 1, "maximum": 10})),
    Tool("open_url", "Open a web page.", _obj(["url"], url=S)),
]
TODO = [
    Tool("add_todo", "Add an item to the to-do list.",
         _obj(["text", "priority"], text=S, priority={"type": "string", "enum": ["low", "medium", "high"]}), mutates=True),
    Tool("list_todos", "Show the to-do list.", _obj()),
]
FILES_RO = DEMO_TOOLS  # served through read_only_view: write_file is unspellable
SENTIMENT = {"type": "object", "required": ["sentiment", "score"], "properties": {
    "sentiment": {"type": "string", "enum": ["positive", "negative", "neutral"]},
    "score": {"type": "integer", "minimum": 0, "maximum": 10}}}

# (name, tools, read_only, question); every table differs
CALLS = [
    ("files", DEMO_TOOLS, False, "What is 17 times 23?"),
    ("files-read-only", FILES_RO, True, "Save the text 'buy milk' to shopping.txt."),
    ("email", EMAIL, False, "Email bob@example.com that the meeting moved to Thursday."),
    ("weather", WEATHER, False, "What's the weather in Paris, in celsius?"),
    ("calendar", CALENDAR, False, "Schedule a 30 minute call with Ana on 2025-03-04."),
    ("math", MATH, False, "Add 2.5 and 4."),
    ("search", SEARCH, False, "Search the web for the best pizza in Naples."),
    ("todo", TODO, False, "Add 'call the plumber' to my to-do list, high priority."),
    ("files-2", DEMO_TOOLS[:2], False, "Read the file todo.md."),
]
SCHEMA_QUESTION = ("Classify the sentiment of this review and score it from 0 to 10, as JSON: "
                   "'The pizza was wonderful and the staff were kind.'")
PLAIN_QUESTION = "Write one sentence about the sea."


def openai_tools(tools) -> list[dict]:
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.parameters, "x-mutates": t.mutates}} for t in tools]


def _chat(tokenizer, user: str) -> list[int]:
    out = tokenizer.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return list(ids)


def requests(tokenizer) -> list[tuple]:
    """(name, prompt ids, railcall spec or None, the tools its output may call)."""
    reqs = []
    for name, tools, read_only, question in CALLS:
        spec = {"tools": openai_tools(tools), "read_only": read_only}
        allowed = read_only_view(tools) if read_only else tools
        reqs.append((name, chat_prompt_ids(tokenizer, tools, question), spec, allowed))
    reqs.append(("schema", _chat(tokenizer, SCHEMA_QUESTION), {"schema": SENTIMENT}, None))
    reqs.append(("plain", _chat(tokenizer, PLAIN_QUESTION), None, None))
    return reqs
