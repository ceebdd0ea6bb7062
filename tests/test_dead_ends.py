"""A grammar never leaves a model at a point where no token is legal: schemas with no finite value
are refused when compiled, with an error that names the cause; a branch that could not be finished
under the depth limit is not offered where it is met; a dead end nothing foresaw would put the
matcher into its error state (only stop tokens offered) instead of an empty mask; and the server
answers such an output with an error, never with a broken call and a normal finish."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from railcall.bitmask import allocate_bitmask, unpack_bitmask
from railcall.runtime.decode import SamplingParams, generate
from railcall.errors import GrammarError, RequestError, SchemaError
from railcall.grammar import instructions, ir, program
from railcall.grammar.instructions import MAX_DEPTH
from railcall.grammar.schema import schema_grammar
from railcall.grammar.tools import Tool, tool_grammar
from railcall.matcher import Matcher, clear_caches, compiled_grammar
from railcall.server import app as server_app
from railcall.server.assemble import Assembler
from test_server_output import Scripted, ids_of, plan_for, served_for

CYCLE = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
         "type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"]}


def compile_schema(schema, vocab):
    return compiled_grammar(schema_grammar(schema), vocab)


@pytest.mark.parametrize("schema, names", [
    (CYCLE, ["'#/$defs/a'", "'#/$defs/b'"]),
    ({"$ref": "#"}, ["'#'"]),
    ({"type": "object", "properties": {"c": {"$ref": "#"}}, "required": ["c"]}, ["'#'"]),
    # optional, but a model that starts it can never finish it
    ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}},
     ["'#/$defs/a'"]),
    ({"type": "array", "items": {"$ref": "#"}, "minItems": 1}, ["'#'"]),
])
def test_a_schema_with_no_finite_value_is_refused(bytes_vocab, schema, names):
    with pytest.raises(GrammarError) as e:
        compile_schema(schema, bytes_vocab)
    msg = str(e.value)
    assert "no finite value" in msg and all(n in msg for n in names) and "optional" in msg


@pytest.mark.parametrize("schema, text", [
    ({"type": "object", "properties": {"c": {"$ref": "#"}}}, b'{"c":{"c":{}}}'),  # optional recursion
    ({"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["kids"]},
     b'{"kids":[{"kids":[]}]}'),  # a tree: the empty array ends it
    ({"type": "object", "properties": {"v": {}}, "required": ["v"]}, b'{"v":[[1],{"a":null}]}'),  # any JSON
    ({"anyOf": [{"$ref": "#"}, {"type": "integer"}]}, b"7"),  # a cycle with a way out
])
def test_recursive_schemas_with_a_way_out_compile(bytes_vocab, schema, text):
    m = Matcher(compile_schema(schema, bytes_vocab))
    assert m.consume_bytes(text) and m.is_accepting()


def bracket_chain(n: int) -> tuple:
    """Rules r0 .. r{n}: r{i} is "[" r{i+1} "]", r{n} is "x"; a value of r{k} nests n - k + 1 deep."""
    chain = tuple((f"r{i}", ir.Seq(ir.Lit(b"["), ir.Ref(f"r{i + 1}"), ir.Lit(b"]"))) for i in range(n))
    return chain + ((f"r{n}", ir.Lit(b"x")),)


def test_references_nested_past_the_depth_limit_are_refused(bytes_vocab):
    n = MAX_DEPTH + 8
    g = ir.Grammar(ir.Ref("r0"), bracket_chain(n))
    with pytest.raises(GrammarError, match=f"{n + 1} deep; railcall allows {MAX_DEPTH}"):
        compiled_grammar(g, bytes_vocab)
    ok = ir.Grammar(ir.Ref(f"r{n + 2 - MAX_DEPTH}"), bracket_chain(n))  # MAX_DEPTH - 1 deep: within the limit
    m = Matcher(compiled_grammar(ok, bytes_vocab))
    brackets = MAX_DEPTH - 2
    assert m.consume_bytes(b"[" * brackets + b"x" + b"]" * brackets) and m.is_accepting()


@pytest.mark.parametrize("pattern", ["^\ud800$", "^[\ud800-\udfff]+$"])
def test_a_pattern_only_surrogates_can_match_is_refused(bytes_vocab, pattern):
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": pattern}}, "required": ["a"]}
    with pytest.raises(GrammarError, match="no string matching"):
        compile_schema(schema, bytes_vocab)


def test_a_pattern_with_an_optional_surrogate_keeps_its_other_strings(bytes_vocab):
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^a\ud800?$"}}, "required": ["a"]}
    m = Matcher(compile_schema(schema, bytes_vocab))
    assert m.consume_bytes(b'{"a":"a"}') and m.is_accepting()


@pytest.mark.parametrize("schema", [{"const": float("nan")}, {"enum": [1, float("inf")]},
                                    {"const": {"x": [float("-inf")]}}, {"enum": ["a\ud800"]}])
def test_constants_json_cannot_spell_are_refused(schema):
    with pytest.raises(SchemaError, match="is not a JSON value"):
        schema_grammar(schema)


@pytest.mark.parametrize("body", [b'{"model":"m","messages":[],"temperature":NaN}',
                                  b'{"model":"m","messages":[],"temperature":-Infinity}'])
def test_a_request_body_with_nan_is_refused(body):
    with pytest.raises(RequestError, match="not valid JSON.*NaN"):
        server_app._parse(body)


def test_min_items_beyond_the_limit_is_refused():
    with pytest.raises(SchemaError, match="minItems 100000000 .*at most 4096"):
        schema_grammar({"type": "array", "minItems": 100_000_000})


def test_explicit_max_length_is_honoured_past_the_string_cap(bytes_vocab):
    tools = [Tool("f", "", {"type": "object", "properties": {"long": {"type": "string", "maxLength": 300},
                                                              "free": {"type": "string"}},
                            "required": ["long", "free"]})]
    cg = compiled_grammar(tool_grammar(tools), bytes_vocab)  # the cap for strings without maxLength: 256

    def accepts(n_long, n_free):
        m = Matcher(cg)
        return m.consume_bytes(b'{"tool":"f","args":{"long":"' + b"x" * n_long + b'","free":"' + b"y" * n_free
                               + b'"}}') and m.is_accepting()

    assert accepts(300, 256)
    assert not accepts(301, 1) and not accepts(1, 257)


def test_min_length_past_the_cap_raises_it_for_that_string(bytes_vocab):
    schema = {"type": "object", "properties": {"s": {"type": "string", "minLength": 300}}, "required": ["s"]}
    m = Matcher(compile_schema(schema, bytes_vocab))
    assert m.consume_bytes(b'{"s":"' + b"z" * 300 + b'"}') and m.is_accepting()


# -- the depth limit: a branch that could not be finished there is not offered --------------------

def deep_optional():
    """"a" then MAX_DEPTH + 9 nested brackets, or "b": the first branch cannot be finished within
    the depth limit, so only "b" is in the grammar; it has a finite value, so it compiles."""
    return ir.Grammar(ir.Alt(ir.Seq(ir.Lit(b"a"), ir.Ref("r0")), ir.Lit(b"b")), bracket_chain(MAX_DEPTH + 8))


def legal_ids(m, vocab):
    bm = allocate_bitmask(vocab.logits_width)
    n = m.fill_bitmask(bm)
    ids = np.flatnonzero(unpack_bitmask(bm, vocab.logits_width)).tolist()
    assert n == len(ids)
    return ids


def test_a_branch_too_deep_for_the_limit_is_not_offered(bytes_vocab):
    m = Matcher(compiled_grammar(deep_optional(), bytes_vocab))
    assert legal_ids(m, bytes_vocab) == [bytes_vocab.lookup[b"b"]]
    assert not m.consume_token(bytes_vocab.lookup[b"a"])


def nested_lists(depth_needed: int):
    """A value is "x" or a list of values; a list may also hold a "deep" item, which must nest
    `depth_needed` more references before it can end."""
    deep = tuple((f"d{i}", ir.Seq(ir.Lit(b"("), ir.Ref(f"d{i + 1}"), ir.Lit(b")"))) for i in range(depth_needed - 1))
    deep += ((f"d{depth_needed - 1}", ir.Lit(b"y")),)
    value = ir.Alt(ir.Lit(b"x"), ir.JsonArray(ir.Alt(ir.Ref("v"), ir.Ref("d0")), min_items=1, max_items=3))
    return ir.Grammar(ir.Ref("v"), (("v", value),) + deep)


def test_nesting_stops_being_offered_where_it_could_not_be_finished(bytes_vocab, monkeypatch):
    """Going as deep as the grammar allows, every step still has a legal way on, and the deep
    item is offered only while its references fit under the limit."""
    for module in (instructions, program):  # the limit is read where threads move and where the compiler checks
        monkeypatch.setattr(module, "MAX_DEPTH", 6)
    clear_caches(bytes_vocab)
    try:
        m = Matcher(compiled_grammar(nested_lists(3), bytes_vocab))
        lookup = bytes_vocab.lookup
        opened = 0
        while lookup[b"["] in legal_ids(m, bytes_vocab):
            # "(" is offered where a list item (depth opened + 1) can nest 3 more: up to 6
            assert (lookup[b"("] in legal_ids(m, bytes_vocab)) == (opened >= 1 and opened + 3 <= 6)
            assert m.consume_token(lookup[b"["])
            opened += 1
        # the k-th list is written at depth k, and a list needs one more level for its item: five
        # lists, then only "x" (a sixth list's item would be at depth 7)
        assert opened == 5 and legal_ids(m, bytes_vocab) == [lookup[b"x"]]
        assert m.consume_tokens([lookup[b"x"]] + [lookup[b"]"]] * 5) and m.is_accepting()
    finally:
        clear_caches(bytes_vocab)


def test_an_optional_recursive_property_is_offered_while_it_fits(bytes_vocab):
    """A schema's optional "next" refers back to the schema: MAX_DEPTH levels of it are written, then
    the innermost object may still close or take "v", but no longer start "next" (before, it
    could start the key and then had no legal byte after it)."""
    schema = {"type": "object", "properties": {"next": {"$ref": "#"}, "v": {"type": "integer"}}}
    m = Matcher(compile_schema(schema, bytes_vocab))
    levels = 0
    while m.copy().consume_bytes(b'{"next":'):
        assert m.consume_bytes(b'{"next":')
        levels += 1
    assert levels == MAX_DEPTH
    assert m.copy().consume_bytes(b"{}") and m.copy().consume_bytes(b'{"v":1}')
    assert not m.copy().consume_bytes(b'{"n')
    assert m.consume_bytes(b'{"v":1}' + b"}" * MAX_DEPTH) and m.is_accepting()


RULE_PARTS = st.lists(st.sampled_from(["[", "(", "x", "ref", "ref", "opt", "list", "key"]), min_size=1, max_size=4)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rules=st.lists(st.lists(RULE_PARTS, min_size=1, max_size=3), min_size=2, max_size=5),
       limit=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_random_recursive_grammars_never_reach_a_dead_end(bytes_vocab, monkeypatch, rules, limit, seed):
    """Random rules (alternatives of literals and of references to the next rules, wrapping
    round: plain, optional, as a list's items, or after one key of a trie), walked at random
    under a small depth limit: the mask is never empty before the grammar is complete, and a
    forced finish always completes."""
    n = len(rules)

    def part(p, i, j):
        target = ir.Ref(f"r{(i + 1 + j) % n}")
        return {"[": ir.Lit(b"["), "(": ir.Lit(b"("), "x": ir.Lit(b"x"), "ref": target,
                "opt": ir.Alt(ir.Lit(b"-"), target),
                "list": ir.JsonArray(target, min_items=0, max_items=2),
                "key": ir.Select(((b"pq", ir.Seq(ir.Lit(b"="), target)), (b"pr", ir.Seq())))}[p]

    g = ir.Grammar(ir.Ref("r0"), tuple(
        (f"r{i}", ir.Alt(*[ir.Seq(*[part(p, i, j) for j, p in enumerate(alt)]) for alt in alts]))
        for i, alts in enumerate(rules)))
    for module in (instructions, program):  # the limit is read where threads move and where the compiler checks
        monkeypatch.setattr(module, "MAX_DEPTH", limit)
    clear_caches(bytes_vocab)
    try:
        try:
            m = Matcher(compiled_grammar(g, bytes_vocab))
        except GrammarError:
            return  # no finite value, or none within the limit: refused, as tested above
        rng = np.random.default_rng(seed)
        stops = set(bytes_vocab.stop_ids)
        for _ in range(60):
            ids = [t for t in legal_ids(m, bytes_vocab) if t not in stops]
            assert not m.is_error(), m.error_message
            if not ids:
                assert m.is_accepting()
                break
            assert m.consume_token(int(rng.choice(ids)))
        m.finish()
        assert m.is_accepting() and not m.is_error()
    finally:
        clear_caches(bytes_vocab)


# -- a dead end the compile-time checks cannot see ---------------------------------------------------
# None is known. To test what happens if one is met, the grammar below is compiled under a higher
# depth limit than it is walked under: its references then run into the limit at run time.

def lowered_limit(vocab, monkeypatch):
    g = ir.Grammar(ir.Seq(ir.Lit(b"a"), ir.Ref("r0")), bracket_chain(40))
    clear_caches(vocab)
    for module in (instructions, program):  # the limit is read where threads move and where the compiler checks
        monkeypatch.setattr(module, "MAX_DEPTH", 64)
    compiled = compiled_grammar(g, vocab)
    for module in (instructions, program):  # the limit is read where threads move and where the compiler checks
        monkeypatch.setattr(module, "MAX_DEPTH", 32)
    return compiled


@pytest.fixture
def dead_end(bytes_vocab, monkeypatch):
    yield lowered_limit(bytes_vocab, monkeypatch)
    clear_caches(bytes_vocab)


def test_a_dead_end_offers_only_stop_tokens_and_says_so(bytes_vocab, dead_end):
    m = Matcher(dead_end)
    steps = 0
    while not m.is_error():
        ids = legal_ids(m, bytes_vocab)
        assert ids, "an empty mask"
        if m.is_error():
            break
        assert m.consume_token(bytes_vocab.lookup[b"a" if steps == 0 else b"["])
        steps += 1
    assert legal_ids(m, bytes_vocab) == sorted(bytes_vocab.stop_ids)
    assert m.is_done() and "dead end" in m.error_message and m.forced_tokens() == []
    m.rollback(1)  # back out of it: the error goes, the brackets before it are still legal
    assert not m.is_error() and m.error_message == ""
    assert bytes_vocab.lookup[b"["] in legal_ids(m, bytes_vocab)


def test_generate_stops_at_a_dead_end_with_a_grammar_error(bytes_vocab, dead_end):
    m = Matcher(dead_end)
    g = generate(Scripted(bytes_vocab, ids_of(bytes_vocab, "a" + "[" * 40)), bytes_vocab, [1], m,
                 SamplingParams(max_tokens=60))
    assert "dead end" in g.grammar_error
    assert all(s.legal for s in g.steps)  # no token was ever drawn from an empty mask
    assert g.text.startswith("a[") and "x" not in g.text


def dead_end_gen(bytes_vocab):
    return SimpleNamespace(tokens=ids_of(bytes_vocab, '{"x"'), text='{"x"', stop_string=None, finish_reason="stop",
                           grammar_error="no token can continue the output here: the grammar has a dead end after 3 tokens")


def test_the_server_answers_a_dead_end_with_an_error(bytes_vocab):
    async def complete():
        job = SimpleNamespace(events=asyncio.Queue(), cancel=lambda: None)
        await job.events.put(("done", (0, dead_end_gen(bytes_vocab))))  # (choice, its generation)

        class Request:
            async def receive(self):
                await asyncio.Event().wait()

        plan = SimpleNamespace(logprobs=False, return_token_ids=False, prompt=[1])
        asm = Assembler(served_for(bytes_vocab), plan_for("required"))
        return await server_app._complete(Request(), job, [asm], plan, "id", 0, "m")

    with pytest.raises(RequestError) as e:
        asyncio.run(complete())
    assert e.value.status == 400 and e.value.code == "grammar_dead_end" and "dead end" in str(e.value)
    assert "simplify the schema or raise max_tokens" in str(e.value)


def test_the_server_streams_a_dead_end_as_an_error_event(bytes_vocab):
    async def stream():
        job = SimpleNamespace(events=asyncio.Queue(), cancel=lambda: None)
        await job.events.put(("done", (0, dead_end_gen(bytes_vocab))))
        plan = SimpleNamespace(logprobs=False, return_token_ids=False, include_usage=False, prompt=[1])
        asm = Assembler(served_for(bytes_vocab), plan_for("required"))
        return [e async for e in server_app._stream(job, [asm], plan, "id", 0, "m")]

    events = asyncio.run(stream())
    payloads = [e.decode() if isinstance(e, bytes) else e for e in events]
    errors = [p for p in payloads if '"error"' in p]
    assert len(errors) == 1 and "grammar_dead_end" in errors[0]
    assert not any('"finish_reason": "stop"' in p or '"finish_reason":"stop"' in p for p in payloads)
    assert "[DONE]" in payloads[-1]


# -- integer bounds past what railcall writes (23 digits) -----------------------------------------

@pytest.mark.parametrize("schema", [
    {"type": "integer", "minimum": 10**30},
    {"type": "integer", "maximum": -10**25},
    {"type": "integer", "exclusiveMinimum": 10**23 - 1},
])
def test_integer_bounds_no_written_integer_meets_are_refused(schema):
    with pytest.raises(SchemaError, match="23 digits") as e:
        schema_grammar(schema)
    assert e.value.keyword in ("minimum", "maximum", "exclusiveMinimum") and e.value.empty


@pytest.mark.parametrize("lo, hi", [(5 * 10**22, None), (None, -5 * 10**22), (10**22 + 7, 10**40),
                                    (-10**40, -(10**22) - 3), (-7, 10**30), (10**22 - 1, 10**22 + 1)])
def test_integer_bounds_near_the_digit_limit_never_dead_end(bytes_vocab, lo, hi):
    """Every digit offered leads to an integer within the bounds that fits the 23-digit limit:
    walking down the largest and the smallest offered digit, each step has a way on."""
    schema = {"type": "integer", **({} if lo is None else {"minimum": lo}), **({} if hi is None else {"maximum": hi})}
    cg = compile_schema(schema, bytes_vocab)
    for pick in (min, max):
        for sign in (b"", b"-"):
            m = Matcher(cg)
            if sign and not m.consume_bytes(sign):
                continue
            text = sign
            while True:
                ids = [t for t in legal_ids(m, bytes_vocab) if t not in bytes_vocab.stop_ids]
                if not ids:
                    assert m.is_accepting(), f"dead end after {text!r}"
                    break
                digits = [t for t in ids if len(bytes_vocab.token_bytes[t]) == 1]
                t = pick(digits, key=lambda t: bytes_vocab.token_bytes[t])
                assert m.consume_token(t)
                text += bytes_vocab.token_bytes[t]
            v = int(text)
            assert (lo is None or v >= lo) and (hi is None or v <= hi) and len(text.lstrip(b"-")) <= 23


@pytest.mark.parametrize("schema", [{"type": "string", "maxLength": 1}, {"type": "string", "minLength": 1, "maxLength": 2},
                                    {"type": "object", "properties": {"s": {"type": "string", "maxLength": 1}},
                                     "required": ["s"]}])
def test_an_escaped_surrogate_pair_has_a_way_on_at_every_byte(bytes_vocab, schema):
    """Inside an escaped surrogate pair at the length limit: the mask is exactly the tokens the
    matcher accepts, never empty, and only the low surrogate's bytes go on from the high one."""
    text = b'"\\ud83d\\ude00"' if schema["type"] == "string" else b'{"s":"\\ud83d\\ude00"}'
    m = Matcher(compile_schema(schema, bytes_vocab))
    for i, b in enumerate(text):
        ids = legal_ids(m, bytes_vocab)
        assert ids == [t for t in range(bytes_vocab.size) if m.copy().consume_token(t)], text[:i]
        assert ids, f"dead end after {text[:i]!r}"
        if text[:i].endswith(b"\\ud83d"):
            assert {bytes_vocab.token_bytes[t][:1] for t in ids} == {b"\\"}
        done = m.copy()
        done.finish()  # a forced finish writes the low surrogate a high one owes
        assert done.is_accepting()
        assert m.consume_bytes(bytes([b]))
    assert m.is_accepting()
