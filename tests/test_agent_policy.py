"""Policy as grammar: read-only and named views compile to grammars without what they exclude;
the approval gate for mutating calls the grammar allows."""

from __future__ import annotations

import json

import pytest

from railcall.agent.loop import name_position
from railcall.agent.policy import Approver, Policy, load_policies, view
from railcall.agent.table import ToolTable
from railcall.errors import GrammarError, PolicyError
from railcall.matcher import Matcher, compiled_grammar

FILES = ["docs/a.md", "docs/b.md", "secret.txt"]


def make_table():
    table = ToolTable()

    def read_file(path: str) -> str:
        """Read a file."""
        return path

    def write_file(path: str, text: str) -> str:
        """Write a file."""
        return "wrote"

    def wipe_disk(confirm: bool) -> str:
        """Erase everything."""
        return "gone"

    def read_dir(path: str, depth: int = 1) -> str:
        """List a folder."""
        return path

    table.register(read_file, domains={"path": lambda ctx: FILES})
    table.register(write_file, mutates=True)
    table.register(wipe_disk, mutates=True)
    table.register(read_dir)
    return table



def test_read_only_view_excludes_mutating_tools_from_the_mask(bpe_vocab):
    table = make_table()
    v = view(table, Policy(read_only=True))
    assert v.names == ["read_file", "read_dir"]
    assert v.left_out == {"write_file": "mutates (read-only)", "wipe_disk": "mutates (read-only)"}
    compiled = compiled_grammar(v.grammar(), bpe_vocab)
    pos = name_position(compiled, bpe_vocab, v, table)
    assert pos["spellable"] == ["read_file", "read_dir"] and pos["excluded_tokens_legal"] == 0
    # the same check on the full view finds tokens that start only the mutating names
    full = view(table, Policy())
    pos_full = name_position(compiled_grammar(full.grammar(), bpe_vocab), bpe_vocab, full, table)
    assert set(pos_full["spellable"]) == set(table.names())
    # token by token: the canonical tokens of a write call are refused at the name
    m = Matcher(compiled)
    ids = bpe_vocab.encode('{"tool":"write_file","args":{"path":"x","text":"y"}}')
    assert not all(m.consume_token(t) for t in ids) and m.is_error()


def test_view_check_is_the_grammar():
    table = make_table()
    v = view(table, Policy(read_only=True))
    assert v.check({"tool": "read_file", "args": {"path": "docs/a.md"}}) == ""
    assert "not in the table" in v.check({"tool": "nope", "args": {}})
    assert "mutates (read-only)" in v.check({"tool": "write_file", "args": {"path": "a", "text": "b"}})
    assert "do not fit" in v.check({"tool": "read_file", "args": {"path": "missing.md"}})
    assert "do not fit" in v.check({"tool": "read_dir", "args": {"path": "x", "depth": "deep"}})
    assert v.check({"tool": "read_dir", "args": {"depth": 2, "path": "x"}}) == ""  # order is the schema's
    assert "not a call" in v.check(["read_file"])


def test_named_policy_allow_list_and_narrowed_domains():
    table = make_table()
    p = Policy("docs-reader", allow={"read_file", "read_dir", "write_file"},
               args={"read_file": {"path": {"glob": "docs/*"}}, "read_dir": {"path": ["docs"], "depth": {"maximum": 2}},
                     "write_file": {"path": ["docs/out.md"]}})
    v = view(table, p)
    assert v.names == ["read_file", "write_file", "read_dir"]
    assert v.left_out == {"wipe_disk": "not on the policy's allow-list"}
    assert v.tool("read_file").parameters["properties"]["path"]["enum"] == ["docs/a.md", "docs/b.md"]
    assert v.check({"tool": "read_file", "args": {"path": "secret.txt"}})
    assert v.check({"tool": "read_dir", "args": {"path": "docs", "depth": 3}})
    assert v.check({"tool": "read_dir", "args": {"path": "docs", "depth": 2}}) == ""
    assert v.check({"tool": "write_file", "args": {"path": "docs/out.md", "text": "t"}}) == ""
    assert v.check({"tool": "write_file", "args": {"path": "elsewhere.md", "text": "t"}})
    # the table's own tools are untouched by a view
    assert "enum" not in table.entry("read_dir").tool.parameters["properties"]["path"]
    # a narrowing that leaves nothing removes the tool
    v2 = view(table, Policy(args={"read_file": {"path": ["not-there.md"]}}))
    assert "read_file" not in v2.names and "required argument" in v2.left_out["read_file"]
    with pytest.raises(GrammarError, match="does not have"):
        view(table, Policy(args={"read_file": {"nope": ["x"]}}))
    with pytest.raises(PolicyError, match="cannot narrow"):
        Policy(args={"read_dir": {"depth": {"pattern": "x"}}})


def test_deny_list_and_empty_view():
    table = make_table()
    v = view(table, Policy(deny={"read_dir"}, read_only=True))
    assert v.names == ["read_file"]
    v = view(table, Policy(allow=set()))
    assert v.names == [] and v.check({"tool": "read_file", "args": {"path": "docs/a.md"}})


def test_policies_file(tmp_path):
    path = tmp_path / "policies.json"
    path.write_text(json.dumps({"reader": {"read_only": True, "approve": "deny"},
                                "ops": {"allow": ["write_file"], "approve_tools": {"write_file": "auto"}}}))
    named = load_policies(path)
    assert named["reader"].read_only and named["reader"].approve == "deny"
    assert named["ops"].approval_for("write_file") == "auto" and named["ops"].approval_for("wipe_disk") == "ask"
    path.write_text(json.dumps({"bad": {"read_onyl": True}}))
    with pytest.raises(ValueError, match="unknown keys"):
        load_policies(path)
    with pytest.raises(ValueError, match="expected one of ask, auto, deny"):
        Policy(approve="maybe")


def test_approval_gate_modes():
    table = make_table()
    write = table.entry("write_file").tool
    read = table.entry("read_file").tool
    asked = []

    def ask(prompt):
        asked.append(prompt)
        return len(asked) == 1  # yes the first time, no after

    gate = Approver(ask)
    assert gate.decide(Policy(), read, {"path": "a"}).mode == "none" and not asked
    d = gate.decide(Policy(), write, {"path": "a", "text": "b"})
    assert d.approved and d.mode == "ask" and "write_file" in asked[0]
    assert not gate.decide(Policy(), write, {"path": "a", "text": "b"}).approved
    assert gate.decide(Policy(approve="auto"), write, {}).approved
    d = gate.decide(Policy(approve="auto", approve_tools={"write_file": "deny"}), write, {})
    assert not d.approved and d.mode == "deny"

    def eof(prompt):
        raise EOFError

    assert not Approver(eof).decide(Policy(), write, {}).approved


@pytest.mark.parametrize("policy, field, found", [
    ({"deny": "write_file"}, "'deny'", 'the string "write_file"; expected a list of tool names, e.g. ["write_file"]'),
    ({"allow": "read_file"}, "'allow'", 'the string "read_file"; expected a list of tool names'),
    ({"allow": 5}, "'allow'", "the number 5; expected a list of tool names"),
    ({"deny": ["write_file", 3]}, "'deny'", 'the list ["write_file", 3]; expected a list of tool names'),
    ({"deny": None}, "'deny'", "null; expected a list of tool names"),
    ({"read_only": "false"}, "'read_only'", 'the string "false"; expected true or false'),
    ({"read_only": 1}, "'read_only'", "the number 1; expected true or false"),
    ({"hard_links": "yes"}, "'hard_links'", 'the string "yes"; expected true or false'),
    ({"approve": ["auto"]}, "'approve'", 'the list ["auto"]; expected one of ask, auto, deny'),
    ({"approve_tools": ["write_file"]}, "'approve_tools'", "the list"),
    ({"approve_tools": {"write_file": "yes"}}, "'approve_tools.write_file'", 'the string "yes"'),
    ({"args": [1]}, "'args'", "the list [1]; expected an object"),
    ({"args": {"read_file": ["x"]}}, "'args.read_file'", 'the list ["x"]; expected an object'),
    ({"args": {"read_file": {"path": 5}}}, "'args.read_file.path'", "the number 5; expected a list of values"),
    ({"args": {"read_file": {"path": {"glob": 5}}}}, "'args.read_file.path.glob'", "the number 5"),
    ({"args": {"read_file": {"path": {"enum": "a"}}}}, "'args.read_file.path.enum'", 'the string "a"'),
    ({"args": {"read_dir": {"depth": {"maximum": "2"}}}}, "'args.read_dir.depth.maximum'", "expected a number"),
    ({"args": {"read_dir": {"path": {"maxLength": -1}}}}, "'args.read_dir.path.maxLength'", "a whole number >= 0"),
])
def test_a_wrongly_typed_policy_field_is_refused_by_name(tmp_path, policy, field, found):
    path = tmp_path / "policies.json"
    path.write_text(json.dumps({"p": policy}))
    with pytest.raises(PolicyError) as e:
        load_policies(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: policy 'p': {field} is ") and found in msg, msg


def test_a_policies_file_of_the_wrong_shape_is_refused(tmp_path):
    path = tmp_path / "policies.json"
    path.write_text(json.dumps({"p": 5}))
    with pytest.raises(PolicyError, match=r"policy 'p' is the number 5; expected an object with any of the keys"):
        load_policies(path)
    path.write_text(json.dumps([{"deny": ["write_file"]}]))
    with pytest.raises(PolicyError, match="expected an object of named policies"):
        load_policies(path)
    path.write_text('{"p": {"deny": ["write_file"]')
    with pytest.raises(PolicyError, match="cannot read policies from"):
        load_policies(path)
    # what a right file means, for contrast: deny and read_only are read as written
    path.write_text(json.dumps({"p": {"deny": ["write_file"], "read_only": False}}))
    p = load_policies(path)["p"]
    assert p.deny == {"write_file"} and p.read_only is False
    assert "write_file" not in view(make_table(), p).names and "wipe_disk" in view(make_table(), p).names


def _docs_workspace(tmp_path):
    from railcall.agent.loop import Agent

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("public")
    (tmp_path / "private").mkdir()
    (tmp_path / "private" / "secret.txt").write_text("SECRET")
    (tmp_path / "out.txt").write_text("out")
    (tmp_path / "notes.txt").write_text("notes")
    policy = Policy("docs-reader", approve="auto", args={"read_file": {"path": {"glob": "docs/*"}},
                                                         "write_file": {"path": ["out.txt"]},
                                                         "append_file": {"path": ["out.txt"]},
                                                         "list_dir": {"path": {"glob": "docs*"}}})
    return Agent.for_workspace(tmp_path, None, policy=policy)


# A call the docs-reader view admits, and the (link, target) that re-links its path to a file
# the narrowing does not admit (tests/hostile.py's re-link race repeats these)
RELINKS = [
    ({"tool": "read_file", "args": {"path": "docs/a.md"}}, ("docs/a.md", "../private/secret.txt")),
    ({"tool": "write_file", "args": {"path": "out.txt", "text": "x"}}, ("out.txt", "notes.txt")),
    ({"tool": "append_file", "args": {"path": "out.txt", "text": "x"}}, ("out.txt", "notes.txt")),
    ({"tool": "list_dir", "args": {"path": "docs"}}, ("docs", "private")),
]


@pytest.mark.parametrize("call, relink", RELINKS)
def test_the_policy_is_checked_again_at_call_time_against_the_resolved_path(tmp_path, call, relink):
    """A path the view admitted, re-linked to a file outside the policy's narrowing before the
    call runs: the tool refuses it, and the file it now leads to is neither read nor written."""
    agent = _docs_workspace(tmp_path)
    v = agent.view()  # built while the path still led where the policy allows
    assert v.check(call) == ""
    link, target = relink
    moved = tmp_path / (link + ".moved")
    (tmp_path / link).rename(moved)
    (tmp_path / link).symlink_to(target)
    decision, result, ok, _ = agent.dispatch(call, v)
    assert not ok and "policy" in result and "SECRET" not in result and "secret" not in result, result
    assert (tmp_path / "private" / "secret.txt").read_text() == "SECRET"
    assert (tmp_path / "notes.txt").read_text() == "notes"


def _state_policies(root, policies: dict):
    (root / ".railcall").mkdir(parents=True, exist_ok=True)
    path = root / ".railcall" / "policies.json"
    path.write_text(json.dumps(policies))
    return path


@pytest.mark.parametrize("planted, why", [
    ({"docs-reader": {}}, "read_only"),  # the built-in docs-reader with every tool
    ({"docs-reader": {"read_only": True}}, "read_file.path"),  # its glob dropped
    ({"docs-reader": {"read_only": True, "args": {"read_file": {"path": {"glob": "*"}}}}}, "read_file.path"),
    ({"team": {"allow": ["read_file", "write_file", "answer"]}}, "write_file"),  # the user's team, with a write
    ({"team": {"allow": ["read_file", "answer"], "hard_links": True}}, "hard_links"),
    ({"mine": {"approve": "auto"}}, "approve"),  # a new name: it may not widen the default either
    ({"mine": {"approve_tools": {"write_file": "auto"}}}, "write_file"),
])
def test_a_workspace_policy_may_not_widen_a_builtin_or_user_one(tmp_path, monkeypatch, planted, why):
    """A workspace's own policies file is anyone's who can write to the workspace: each of its
    policies may only narrow the one of that name from the user's config ($RAILCALL_HOME, outside
    every workspace), the built-in one, or else the default."""
    monkeypatch.setenv("RAILCALL_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "policies.json").write_text(json.dumps({"team": {"allow": ["read_file", "answer"]}}))
    path = _state_policies(tmp_path / "ws", planted)
    with pytest.raises(PolicyError, match="widen") as e:
        load_policies(path)
    assert why in str(e.value) and str(path) in str(e.value)


def test_a_workspace_policy_that_narrows_is_loaded_beside_the_user_and_builtin_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("RAILCALL_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "policies.json").write_text(json.dumps({
        "team": {"allow": ["read_file", "write_file", "answer"], "approve_tools": {"write_file": "auto"}}}))
    path = _state_policies(tmp_path / "ws", {
        "team": {"allow": ["read_file", "answer"], "approve": "deny"},
        "docs-reader": {"read_only": True, "args": {"read_file": {"path": ["docs/a.md"]}}},
        "calc-only": {"allow": ["calc", "answer"]}})
    named = load_policies(path)
    assert named["team"].allow == {"read_file", "answer"} and named["team"].approve == "deny"
    assert named["docs-reader"].args == {"read_file": {"path": ["docs/a.md"]}}
    assert named["calc-only"].allow == {"calc", "answer"}
    (tmp_path / "ws" / ".railcall" / "policies.json").unlink()
    named = load_policies(path)  # no workspace file: the user's and the built-in ones
    assert named["team"].approval_for("write_file") == "auto" and named["docs-reader"].read_only
