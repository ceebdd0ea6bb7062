"""The progress options: a call already made in the episode is unspellable (policy as grammar),
observations written short, the facts turn with `answer` offered."""

from __future__ import annotations

import json
import random

from agentkit import scripted_model


from railcall.agent.loop import Agent
from railcall.agent.policy import Policy, View
from railcall.runtime.decode import SamplingParams
from railcall.agent.progress import Helps, facts_turn, observation, without_repeats
from railcall.grammar.tools import Tool


def call(tool, **args) -> str:
    return json.dumps({"tool": tool, "args": args}, separators=(",", ":"))


def make(tmp_path, replies, renders=None, **kw):
    (tmp_path / "notes.txt").write_text("Meeting on Thursday.")
    (tmp_path / "docs").mkdir(exist_ok=True)
    (tmp_path / "docs" / "plan.md").write_text("plan")
    return Agent.for_workspace(tmp_path, scripted_model(replies, renders), trace=tmp_path / "trace.jsonl", **kw)


CALC = Tool("calc", "Arithmetic.", {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]})


def test_a_repeated_read_is_unspellable_and_the_model_is_steered_off_it(tmp_path):
    a = make(tmp_path, [call("read_file", path="notes.txt")] * 3, max_steps=3)
    ep = a.run("read notes")
    paths = [c["args"].get("path") for c in ep.calls if c["tool"] == "read_file"]
    assert paths[0] == "notes.txt" and paths.count("notes.txt") == 1  # the repeat could not be written
    step2 = ep.steps[1]
    assert step2["view"] and "read_file" in step2["view"]
    # the second step's view: the path enum lost notes.txt; its grammar refuses the repeat
    v = a.view()
    tools, gone = without_repeats(v.tools, [{"tool": "read_file", "args": {"path": "notes.txt"}}])
    view = View(tools, v.policy, v.table_version, gone)
    assert "do not fit" in view.check({"tool": "read_file", "args": {"path": "notes.txt"}})
    assert view.check({"tool": "read_file", "args": {"path": "docs/plan.md"}}) == ""
    # every path read: read_file is left out, so its name is unspellable too
    tools, gone = without_repeats(v.tools, [{"tool": "read_file", "args": {"path": p}} for p in a.workspace.files()])
    assert "read_file" not in [t.name for t in tools] and "called already" in gone["read_file"]


def test_a_repeated_free_text_call_is_unspellable_but_its_neighbours_are_not():
    tools, _ = without_repeats([CALC], [{"tool": "calc", "args": {"expr": "buy milk"}},
                                        {"tool": "calc", "args": {"expr": "17*23"}}, {"tool": "calc", "args": {"expr": "🎉!"}}])
    v = View(tools, Policy(), 0, {})
    for expr, ok in [("buy milk", False), ("17*23", False), ("buy mil", True), ("buy milk,", True),
                     ("17*2", True), ("17*234", True), ("6*7", True), ("bu\u202ey", True), ("🎉", True), ("🎉!", False), ("🎉!!", True)]:
        assert (v.check({"tool": "calc", "args": {"expr": expr}}) == "") is ok, expr


def test_the_exclusion_refuses_exactly_the_used_strings():
    rng = random.Random(0)
    alphabet = "ab1*. é\n\"\\🎉"
    for _ in range(60):
        values = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 3))]
        tools, _ = without_repeats([CALC], [{"tool": "calc", "args": {"expr": v}} for v in values])
        v = View(tools, Policy(), 0, {})
        probes = values + [x[:k] for x in values for k in range(1, len(x))] + [x + c for x in values for c in "ab"]
        probes += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 7))) for _ in range(20)]
        for s in probes:
            assert (v.check({"tool": "calc", "args": {"expr": s}}) == "") is (s not in values), (values, s)


def test_a_repeat_of_calc_is_unspellable_inside_its_arithmetic_pattern(tmp_path):
    a = make(tmp_path, [])
    calc = a.view().tool("calc")
    assert "pattern" in calc.parameters["properties"]["expr"]  # calc's own grammar: arithmetic only
    tools, _ = without_repeats([calc], [{"tool": "calc", "args": {"expr": "17*23"}}])
    v = View(tools, Policy(), 0, {})
    for expr, ok in [("17*23", False), ("17*2", True), ("17*23+1", True), ("buy milk", False), ("(1+2)*3", True)]:
        assert (v.check({"tool": "calc", "args": {"expr": expr}}) == "") is ok, expr


def test_a_successful_write_makes_earlier_reads_spellable_again(tmp_path):
    replies = [call("read_file", path="notes.txt"), call("write_file", path="notes.txt", text="Moved to Friday."),
               call("read_file", path="notes.txt"), call("answer", text="Friday")]
    a = make(tmp_path, replies, policy=Policy(approve="auto"), max_steps=4, helps=Helps.off("copied_text"),
             params=SamplingParams(max_tokens=128))  # one byte per token; the text is not the request's words
    ep = a.run("move the meeting and check")
    assert [c["args"].get("path") for c in ep.calls[:3]] == ["notes.txt"] * 3
    assert ep.steps[2]["result"] == "Moved to Friday." and ep.answer == "Friday"


def test_with_the_option_off_a_repeat_is_spellable(tmp_path):
    a = make(tmp_path, [call("read_file", path="notes.txt")] * 2, max_steps=2, helps=Helps.off("no_repeats"))
    ep = a.run("read notes")
    assert [c["args"]["path"] for c in ep.calls] == ["notes.txt", "notes.txt"]


def test_observations_and_the_facts_turn(tmp_path):
    renders = []
    a = make(tmp_path, [call("list_dir", path="."), call("read_file", path="notes.txt"), call("answer", text="Thu")],
             renders, helps=Helps.off("task_files"))
    a.run("When is the meeting?")
    assert renders[1][-1]["content"].startswith("The folder . holds: docs/, notes.txt")
    assert "reply with" not in renders[1][-1]["content"]  # a listing alone is not offered as the answer
    last = renders[2][-1]["content"]
    assert last.startswith("notes.txt says: Meeting on Thursday.")
    assert "The task: When is the meeting?" in last
    # the answer offered holds every fact gathered, listing included, once one is not a listing
    assert ('reply with: {"tool":"answer","args":{"text":"The folder . holds: docs/, notes.txt '
            'notes.txt says: Meeting on Thursday."}}') in last
    # a listing alone is not offered, whether the request names a file or not
    for task in ("List the files in the docs folder.", "What does docs/plan.md say?"):
        renders.clear()
        a = make(tmp_path, [call("list_dir", path="docs"), call("answer", text="plan.md")], renders,
                 helps=Helps.off("read_named"))
        a.run(task)
        assert "reply with" not in renders[1][-1]["content"]
    renders.clear()
    a = make(tmp_path, [call("read_file", path="notes.txt"), call("answer", text="x")], renders, helps=Helps.none())
    a.run("When is the meeting?")
    assert renders[1][-1]["content"] == "Result: Meeting on Thursday."
    # a listing is no answer to offer; an error says to do something else
    assert "reply with" not in facts_turn("t", ["The folder . holds: a.txt"], None)
    assert observation({"tool": "calc", "args": {"expr": "x"}}, "error: bad", True).startswith("error: bad (that call")
    assert observation({"tool": "calc", "args": {"expr": "6*7"}}, "42", True) == "6*7 = 42"
    # what a write holds is quoted without JSON escapes (offered back inside answer's JSON string)
    saved = observation({"tool": "write_file", "args": {"path": "a.txt", "text": "eggs\nmilk"}}, "wrote", True)
    assert saved == "Saved a.txt: it now holds 'eggs milk'."
    saved = observation({"tool": "write_file", "args": {"path": "a.txt", "text": 'say "hi"\nnow'}}, "wrote", True)
    assert saved == "Saved a.txt: it now holds 'say \"hi\" now'."
    assert len(observation({"tool": "read_file", "args": {"path": "a"}}, "x" * 5000, True)) < 600


def test_helps_options():
    assert Helps().label() == "defaults" and Helps.off("facts").label() == "without facts"
    try:
        Helps.off("speed")
    except ValueError as e:
        assert "unknown option" in str(e) and "no_repeats" in str(e)
    else:
        raise AssertionError("an unknown option was accepted")


def test_helps_turned_on_and_off():
    assert Helps.chosen(on=["examples"]).label() == "defaults"  # on already
    assert Helps.chosen(off=["examples", "facts"]).label() == "without facts, examples"
    assert Helps(examples=False, copied_text=False).toggled("examples").label() == "without copied_text"
    assert not Helps().toggled("examples").examples and not Helps().toggled("facts").facts
    for on, off, says in ((["speed"], [], "unknown option"), (["facts"], ["facts"], "both on and off")):
        try:
            Helps.chosen(on=on, off=off)
        except ValueError as e:
            assert says in str(e)
        else:
            raise AssertionError(f"{on} / {off} was accepted")


def test_examples_show_a_request_and_its_call_for_each_tool(tmp_path):
    """Helps.examples: the system prompt shows each built-in's own example (never `answer` or
    `run`), and a made-up one for a tool of the user's; each example call parses in the format;
    off, the prompt has none."""
    from railcall.agent.builtins import EXAMPLES
    from railcall.agent.progress import tool_examples
    from railcall.eval.runner import read_calls
    from railcall.vocab import Vocabulary

    renders = []
    a = make(tmp_path, [call("answer", text="x")], renders, helps=Helps.chosen(on=["examples"]))
    def get_weather(city: str) -> str:
        """Weather in a city."""
        return city

    a.table.register(get_weather)
    a.run("Save anything")  # a request that asks for a change: the writing tools are offered
    system = renders[0][0]["content"]
    assert "Examples of requests and the call for each:" in system
    assert '- "Save the text \'see you at 5\' to memo.txt." -> ' + call("write_file", path="memo.txt", text="see you at 5") in system
    assert '{"tool":"answer"' not in system.split("Examples")[1] and '"tool":"run"' not in system
    assert '-> {"tool":"get_weather","args":{"city":' in system  # built from the tool's schema
    bytes_vocab = Vocabulary.from_pieces([bytes([b]) for b in range(256)], name="bytes-256")
    for fmt in ("json", "openai", "pythonic"):
        lines = tool_examples(a.view().tools, fmt).splitlines()[1:]
        assert len(lines) == len(EXAMPLES) + 1
        for line in lines:
            text = line.split(" -> ", 1)[1]
            calls, _ = read_calls(bytes_vocab, list(text.encode()), fmt, "required")
            assert calls and len(calls) == 1, (fmt, text)
    renders.clear()
    make(tmp_path, [call("answer", text="x")], renders, helps=Helps.off("examples")).run("anything")
    assert "Examples of requests" not in renders[0][0]["content"]


# -- task_files and copied_text: the episode's scope ------------------------------------------

def test_the_files_a_request_names():
    from railcall.agent.progress import task_files

    assert task_files("Write 'hello world' to hello.txt.") == ["hello.txt"]
    assert task_files("What colour is the car in docs/car.md?") == ["docs/car.md"]
    assert task_files("open ./a.txt and report.v2.csv, then a.txt") == ["a.txt", "report.v2.csv"]
    # a number, an abbreviation, a phone number: no file
    assert task_files("pi is 3.14, e.g. this; call 555-0199") == []


def test_the_runs_of_a_requests_words():
    from railcall.agent.progress import request_spans

    spans = request_spans("Save 'buy milk' to shopping.txt.")
    assert "buy milk" in spans and "shopping.txt" in spans and "Save 'buy milk' to shopping.txt" in spans
    assert "'buy milk'" not in spans and "" not in spans  # quotes and a sentence's end trimmed
    assert len(spans) == len(set(spans))
    assert max(len(s.split()) for s in request_spans(" ".join(f"w{i}" for i in range(40)))) == 12


def test_the_episode_scope_narrows_writes_to_the_named_files_and_the_requests_words(tmp_path):
    from railcall.agent.policy import view
    from railcall.agent.progress import episode_scoped

    a = make(tmp_path, [])
    task = "Save 'buy milk' to shopping.txt"
    policy, scope = episode_scoped(a.policy, a.table, task, files=True, text=True, computed=["42"])
    assert scope["files"] == ["shopping.txt"] and scope["text"] > 10
    v = view(a.table, policy)
    ok = lambda tool, **args: v.check({"tool": tool, "args": args}) == ""  # noqa: E731
    assert ok("write_file", path="shopping.txt", text="buy milk") and ok("write_file", path="shopping.txt", text="42")
    assert not ok("write_file", path="notes.txt", text="buy milk")  # a file the request does not name
    assert not ok("write_file", path="shopping.txt", text="the folder holds notes.txt")  # words of its own
    assert "append_file" not in v.names  # shopping.txt does not exist: nothing to append to
    assert ok("read_file", path="notes.txt") and ok("calc", expr="1+2")  # reads are not scoped
    # a policy's own narrowing still holds: the scope meets it
    narrowed = a.policy.with_(args={"write_file": {"path": ["other.txt"]}})
    policy, _ = episode_scoped(narrowed, a.table, task, files=True, text=False)
    assert "write_file" not in view(a.table, policy).names
    # each option alone; a change asked with no file named leaves paths as they were
    policy, scope = episode_scoped(a.policy, a.table, "Save the code 4411 somewhere", files=True, text=False)
    assert scope == {} and policy is a.policy
    # a request that asks for no file to change gets no file to write; remember still runs
    policy, scope = episode_scoped(a.policy, a.table, "Remember the code 4411", files=True, text=False)
    assert scope == {"files": []} and {"write_file", "append_file"}.isdisjoint(view(a.table, policy).names)
    assert "remember" in view(a.table, policy).names
    policy, _ = episode_scoped(a.policy, a.table, task, files=False, text=True)
    assert view(a.table, policy).check({"tool": "write_file", "args": {"path": "notes.txt", "text": "buy milk"}}) == ""


def test_a_request_that_asks_for_no_change_can_change_no_file(tmp_path):
    """Under task_files, "What is in notes.txt?" gets no write scope: a model that would write
    notes.txt over (SmolLM2 did, with the request as its text) finds no mutating file tool."""
    from railcall.agent.progress import asks_for_change

    for task in ["What is in notes.txt?", "Who signed letter.txt?", "List the files in photos.",
                 "Use the saved skill to get the number.", "How many hours does hours.txt list?"]:
        assert not asks_for_change(task), task
    for task in ["Save 'hi' to notes.txt", "Please add milk to list.txt", "Tidy up todo.md",
                 "Copy a.txt to b.txt", "Set the port to 80 in config.ini"]:
        assert asks_for_change(task), task
    for tool in ("write_file", "append_file"):
        a = make(tmp_path, [call(tool, path="notes.txt", text="What is in notes.txt?")], max_steps=1,
                 policy=Policy(approve="auto"))
        ep = a.run("What is in notes.txt?")
        step = ep.steps[0]
        assert tool not in step["view"] and step["scope"]["files"] == [] and ep.calls[0]["tool"] not in (tool,)
        assert (tmp_path / "notes.txt").read_text() == "Meeting on Thursday."
    # a request that asks for the change keeps its file writable
    a = make(tmp_path, [call("write_file", path="notes.txt", text="hi")], max_steps=1, policy=Policy(approve="auto"),
             helps=Helps.off("read_named"))
    ep = a.run("Save 'hi' to notes.txt")
    assert "write_file" in ep.steps[0]["view"] and ep.calls[0] == {"tool": "write_file", "args": {"path": "notes.txt", "text": "hi"}}
    assert (tmp_path / "notes.txt").read_text().startswith("hi")


def test_an_episode_writes_only_what_its_scope_allows(tmp_path):
    # the scripted model tries notes.txt first: unspellable, the grammar writes shopping.txt
    renders: list = []
    a = make(tmp_path, [call("write_file", path="notes.txt", text="buy milk"), call("answer", text="saved")], renders,
             policy=Policy(approve="auto"), max_steps=2, params=SamplingParams(max_tokens=128))
    ep = a.run("Save 'buy milk' to shopping.txt")
    assert ep.calls[0]["tool"] == "write_file" and ep.calls[0]["args"]["path"] == "shopping.txt"
    assert (tmp_path / "notes.txt").read_text() == "Meeting on Thursday."
    assert ep.steps[0]["scope"]["files"] == ["shopping.txt"]
    # the prompt describes write_file as the table does, not the ~20 runs of the request's words
    system = renders[0][0]["content"]
    assert "write_file" in system and '"buy milk"' not in system
    (tmp_path / "b").mkdir()
    off = make(tmp_path / "b", [call("write_file", path="notes.txt", text="anything")], max_steps=1,
               policy=Policy(approve="auto"), helps=Helps.off("task_files", "copied_text"),
               params=SamplingParams(max_tokens=128))
    assert off.run("Save 'buy milk' to shopping.txt").calls[0]["args"] == {"path": "notes.txt", "text": "anything"}


def test_while_a_named_file_is_unused_no_answer_is_offered(tmp_path):
    renders: list = []
    a = make(tmp_path, [call("read_file", path="notes.txt"), call("write_file", path="hello.txt", text="hi"),
                        call("answer", text="done")], renders, policy=Policy(approve="auto"), max_steps=3,
             params=SamplingParams(max_tokens=128))
    ep = a.run("Write hi to hello.txt.")
    second = renders[1][-1]["content"]
    assert "reply with" not in second and "The task names hello.txt, and no call has used it yet" in second
    third = renders[2][-1]["content"]  # hello.txt written: the facts are offered as the answer again
    assert "reply with" in third and "no call has used" not in third
    assert ep.success and (tmp_path / "hello.txt").read_text() == "hi"
    # without task_files the answer is offered after the first read, as before
    renders.clear()
    (tmp_path / "b").mkdir()
    b = make(tmp_path / "b", [call("read_file", path="notes.txt"), call("answer", text="x")], renders,
             helps=Helps.off("task_files"))
    b.run("Write hi to hello.txt.")
    assert "reply with" in renders[1][-1]["content"]


def test_a_named_file_no_tool_can_reach_is_not_waited_for(tmp_path):
    # read-only: shopping.txt does not exist and nothing may write it, so the answer is offered
    renders: list = []
    a = make(tmp_path, [call("read_file", path="notes.txt"), call("answer", text="no")], renders,
             policy=Policy(read_only=True), max_steps=2)
    assert a.run("Save 'buy milk' to shopping.txt.").success
    assert "reply with" in renders[1][-1]["content"] and "no call has used" not in renders[1][-1]["content"]


def test_copied_numbers_calc_computes_with_the_numbers_seen(tmp_path):
    from railcall.agent.progress import expressions_over, numbers_seen, with_seen_numbers

    a = make(tmp_path, [])
    tools, gone = with_seen_numbers(a.view().tools, ["7"])
    assert "calc" not in [t.name for t in tools] and "fewer than two numbers" in gone["calc"]
    assert numbers_seen(["apple 12\npear 30\n", "v1.2.3, 4.50 and 12"]) == ["12", "30", "4.50"]
    # a phone number, a date or a leading zero is not a number to compute with
    assert numbers_seen(["Save 555-0199 to phone.txt", "due 2023-01-01 or 3/4/2025", "code 0199"]) == []
    # a number written as a word counts, in the order it was written; "one" does not
    assert numbers_seen(["What is three times the price?", "price: 25"]) == ["3", "25"]
    assert numbers_seen(["Twice 40, for one person"]) == ["2", "40"]
    assert expressions_over(["12", "30"]) == ["12+30", "12-30", "12*30", "12/30", "30-12", "30/12"]
    assert expressions_over([str(i) for i in range(20)])[0] == "+".join(map(str, range(8)))
    tools, _ = with_seen_numbers(a.view().tools, ["12", "30", "4.50"])
    v = View(tools, Policy(), 0, {})
    for expr, ok in [("12+30+4.50", True), ("12*30*4.50", True), ("12+30", False), ("12+31+4.50", False),
                     ("buy", False)]:
        assert (v.check({"tool": "calc", "args": {"expr": expr}}) == "") is ok, expr
    # in an episode: before the file is read calc is not callable; after it, its numbers are
    # joined, and the facts turn lists them until calc has run
    replies = [call("read_file", path="prices.txt"), call("calc", expr="12+30"), call("answer", text="42")]
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "prices.txt").write_text("apple 12\npear 30\n")
    renders: list = []
    b = make(tmp_path / "b", replies, renders, helps=Helps(copied_numbers=True), max_steps=3)
    ep = b.run("What is the total of the prices?")
    assert "calc" not in ep.steps[0]["view"] and "calc" in ep.steps[1]["view"]
    assert [c for c in ep.calls if c["tool"] == "calc"] == [{"tool": "calc", "args": {"expr": "12+30"}}]
    assert ep.answer == "42"
    after_read = renders[1][-1]["content"]
    assert "Numbers found: 12, 30. If the task needs arithmetic on them, call calc." in after_read
    assert "reply with" not in after_read  # no ready answer beside the numbers
    after_calc = renders[2][-1]["content"]
    assert "Numbers found" not in after_calc  # calc has run: its result is offered
    assert 'reply with: {"tool":"answer","args":{"text":"12+30 = 42"}}' in after_calc


def test_quoted_spans_are_what_the_request_quotes():
    from railcall.agent.progress import quoted_spans, unwritten

    assert quoted_spans("Save 'buy milk' to shopping.txt") == ["buy milk"]
    assert quoted_spans("Let's append the line '- call Bob' to Bob's todo.md.") == ["- call Bob"]
    assert quoted_spans('say "hi there", `x` and \u201cfancy\u201d twice: "hi there"') == ["hi there", "x", "fancy"]
    assert quoted_spans("it's Bob's file") == [] and quoted_spans("no quotes here") == []
    assert quoted_spans("'" + "a" * 300 + "'") == []  # longer than a copied run may be
    assert unwritten("Write 'a' and 'b'", ["b", "c"]) == ["a"]


def test_quoted_text_writes_the_quoted_span_and_waits_for_it(tmp_path):
    # the scripted model tries to write the whole request: with quoted_text only "buy milk" is
    # spellable, and until it is written the answer is not offered
    renders: list = []
    a = make(tmp_path, [call("read_file", path="notes.txt"), call("write_file", path="shopping.txt", text="Save"),
                        call("answer", text="saved")], renders, policy=Policy(approve="auto"), max_steps=3,
             params=SamplingParams(max_tokens=128))
    ep = a.run("Save 'buy milk' to shopping.txt")
    assert ep.steps[0]["scope"]["text"] == ["buy milk"]
    assert (tmp_path / "shopping.txt").read_text() == "buy milk"
    second = renders[1][-1]["content"]
    assert "reply with" not in second and 'The task names shopping.txt, "buy milk", and no call has used them' in second
    assert "reply with" in renders[2][-1]["content"]
    # off: any run of the request's words, and the answer is offered once shopping.txt was used
    renders.clear()
    (tmp_path / "b").mkdir()
    b = make(tmp_path / "b", [call("write_file", path="shopping.txt", text="Save"), call("answer", text="x")],
             renders, policy=Policy(approve="auto"), max_steps=2, params=SamplingParams(max_tokens=128),
             helps=Helps.off("quoted_text"))
    b.run("Save 'buy milk' to shopping.txt")
    assert (tmp_path / "b" / "shopping.txt").read_text() == "Save"
    assert "reply with" in renders[1][-1]["content"]


def test_quoted_text_is_not_waited_for_where_nothing_can_write(tmp_path):
    renders: list = []
    a = make(tmp_path, [call("read_file", path="notes.txt"), call("answer", text="no")], renders,
             policy=Policy(read_only=True), max_steps=2)
    assert a.run("Put the word 'done' in notes.txt.").success
    assert "reply with" in renders[1][-1]["content"]


def test_the_offered_answer_fits_the_token_budget_and_holds_the_asked_file(tmp_path):
    from railcall.agent.progress import ready_answer

    long = "notes.txt says: " + "word " * 200
    assert len(ready_answer(long)) < 400  # OFFER_LIMIT characters at most
    short = ready_answer(long, fits=lambda c: len(c) <= 80)
    assert len(short) <= 80 and short.startswith('{"tool":"answer"') and short.endswith('"}}')
    # in the loop: the budget is the model's tokens; facts about the file the request names come first
    renders: list = []
    (tmp_path / "other.txt").write_text("x " * 150)
    a = make(tmp_path, [call("read_file", path="notes.txt"), call("read_file", path="other.txt"),
                        call("answer", text="Thursday")], renders, max_steps=3, params=SamplingParams(max_tokens=100))
    a.model.vocab.encoder = lambda text: list(text.encode())  # the byte vocabulary's own tokenization
    a.run("When is the meeting in notes.txt?")
    last = renders[2][-1]["content"]
    offered = last[last.index("reply with: ") + len("reply with: "):].splitlines()[0]
    assert json.loads(offered)["args"]["text"].startswith("notes.txt says: Meeting on Thursday.")
    assert len(offered.encode()) < 100 and "other.txt" not in offered  # only the file the request names
    renders.clear()
    (tmp_path / "b").mkdir()
    b = make(tmp_path / "b", [call("read_file", path="notes.txt"), call("read_file", path="docs/plan.md"),
                              call("answer", text="Thursday")], renders, max_steps=3, params=SamplingParams(max_tokens=100))
    b.model.vocab.encoder = lambda text: list(text.encode())
    b.run("When is the meeting?")  # no file named: every fact, cut to fit
    last = renders[2][-1]["content"]
    offered = last[last.index("reply with: ") + len("reply with: "):].splitlines()[0]
    assert json.loads(offered)["args"]["text"] == "notes.txt says: Meeting on Thursday. docs/plan.md says: plan"


def test_the_command_line_help_lists_each_option_under_the_way_it_can_be_turned():
    import re

    from railcall import cli

    def named(text):
        return set(re.findall(r"\b([a-z]+_[a-z_]+|facts|examples)\b", text.split(":", 1)[1])) & set(Helps.names())

    defaults = Helps()
    assert named(cli.HELPS_OFF_HELP) == {n for n in Helps.names() if getattr(defaults, n)}
    assert named(cli.HELPS_ON_HELP) == {n for n in Helps.names() if not getattr(defaults, n)}  # none, today


def test_read_named_reads_the_files_the_request_names_first(tmp_path):
    # the scripted model lists the folder first; with read_named only read_file of the named
    # file is spellable until one was used, then the whole view is back
    renders: list = []
    a = make(tmp_path, [call("list_dir", path="."), call("list_dir", path="."), call("answer", text="Thursday")],
             renders, max_steps=3)
    ep = a.run("When is the meeting? See notes.txt.")
    assert ep.calls[0] == {"tool": "read_file", "args": {"path": "notes.txt"}}
    assert ep.steps[0]["view"] == ["read_file"] and "list_dir" in ep.steps[0]["left_out"]
    assert ep.calls[1] == {"tool": "list_dir", "args": {"path": "."}}  # notes.txt used: free again
    system = renders[0][0]["content"]
    assert "- read_file" in system and "- list_dir" not in system  # the prompt describes the narrowed view
    # a named file that does not exist is not forced (nothing can read it); nor with the option off
    b = make(tmp_path / "b" if (tmp_path / "b").mkdir() is None else None, [call("list_dir", path=".")], max_steps=1)
    assert b.run("Save 'x' to new.txt").calls[0]["tool"] == "list_dir"
    c = make(tmp_path / "c" if (tmp_path / "c").mkdir() is None else None, [call("list_dir", path=".")], max_steps=1,
             helps=Helps.off("read_named"))
    assert c.run("What is in notes.txt?").calls[0]["tool"] == "list_dir"
    # read-only and a named file that exists: read first too (nothing mutates there anyway)
    d = make(tmp_path / "d" if (tmp_path / "d").mkdir() is None else None, [call("answer", text="no")], max_steps=1,
             policy=Policy(read_only=True))
    assert d.run("Delete everything in notes.txt").calls[0]["tool"] == "read_file"


def test_scored_values_route_an_enumerated_argument_in_the_loop(tmp_path):
    a = make(tmp_path, [call("read_file", path="docs/plan.md")], max_steps=1)
    ep = a.run("read the plan")
    assert ep.calls[0]["args"]["path"] == "docs/plan.md" and ep.steps[0]["routed"] == 2  # the name, then the path
    (tmp_path / "b").mkdir()
    b = make(tmp_path / "b", [call("read_file", path="docs/plan.md")], max_steps=1, helps=Helps.off("scored_values"))
    ep = b.run("read the plan")
    assert ep.calls[0]["args"]["path"] == "docs/plan.md" and ep.steps[0]["routed"] == 1


def test_a_read_only_episode_asked_for_a_change_offers_an_answer_that_says_nothing_changed(tmp_path):
    """Under a read-only policy, a request that asks for a change gets, as its ready answer, the
    refusal first and then what was found; a request that asks for no change gets none."""
    from railcall.agent.progress import REFUSAL

    (tmp_path / "todo.md").write_text("- buy bread\n")
    for task, refused in (("Add 'call the plumber' to todo.md.", True), ("What is in todo.md?", False)):
        renders = []
        a = make(tmp_path, [call("read_file", path="todo.md"), call("answer", text="x")], renders,
                 policy=Policy(read_only=True))
        a.run(task)
        last = renders[1][-1]["content"]
        offered = last[last.index("reply with: "):]
        assert (REFUSAL in offered) == refused and "todo.md says: - buy bread" in offered, offered
