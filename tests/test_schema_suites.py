"""Schemas nobody here wrote: the official JSON-Schema-Test-Suite (beside llguidance) and every
BFCL tool, plus a fuzz of random schemas."""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from railcall.bench import coverage
from railcall.data import bfcl_data, jsts_folder
from railcall.eval import bfcl
from railcall.errors import GrammarError, MatcherError
from railcall.eval.bfcl_dialect import bfcl_tools
from railcall.grammar.schema import SchemaOptions, schema_grammar
from railcall.grammar.tools import ToolGrammarBuilder
from railcall.matcher import CompiledGrammar, Matcher

from toolgen import pick_token

JSTS = jsts_folder()  # the JSON-Schema-Test-Suite from jsonschema's sdist (fetched by `make setup`)
BFCL = bfcl_data()  # the installed bfcl-eval package's data


def test_official_suite_at_least_as_high_as_llguidance():
    """Per instance: valid accepted, invalid rejected; railcall's total at least llguidance's,
    and no crash (every schema compiles or is a clean error)."""
    results = coverage.run(JSTS)
    tot = coverage.totals(results)
    rc, ll = tot["railcall"], tot["llguidance"]
    assert rc.crashes == 0, [e for t in results["railcall"].values() for e in t.errors if e.startswith("CRASH")]
    assert rc.passed >= ll.passed and rc.compiled >= ll.compiled
    assert rc.passed > 0.55 * rc.tests
    # keywords railcall claims are enforced on every instance of the schemas that compile
    for kw in ("pattern", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "required",
               "maxItems", "minItems", "format:uuid", "format:ipv4", "format:ipv6", "format:date", "format:uri"):
        t = results["railcall"][kw]
        compiled_tests = t.valid_ok + t.invalid_ok + (t.tests - t.passed if t.compiled == t.schemas else 0)
        assert t.compiled == 0 or t.passed == compiled_tests, (kw, t.errors)


def _bfcl_functions(languages=("python",)):
    """Every distinct BFCL function of the single-turn categories in `languages`."""
    seen, out = set(), []
    for c in bfcl.SINGLE_TURN:
        if bfcl.language(c) not in languages:
            continue
        for line in bfcl.category_file(BFCL, c).read_text().splitlines():
            for f in json.loads(line)["function"]:
                key = json.dumps(f, sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    out.append(f)
    return out


def test_every_bfcl_tool_compiles(bytes_vocab):
    """Every tool of every single-turn category, as the evaluation builds it (Java and
    JavaScript parameters as strings in the language's syntax)."""
    builder = ToolGrammarBuilder()
    for lang in ("python", "java", "javascript"):
        funcs = _bfcl_functions((lang,))
        assert len(funcs) > (1000 if lang == "python" else 40)
        for tool in bfcl_tools(funcs, lang):
            builder.args_ir(tool)  # raises on any schema it cannot compile


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.randoms(use_true_random=False))
def test_sampled_bfcl_arguments_validate(bpe_vocab, rnd):
    """Random walks through a random BFCL tool's argument grammar end in JSON that validates
    against the tool's (mapped) schema with `jsonschema`, finish() included."""
    funcs = _bfcl_functions()
    tool = bfcl_tools([rnd.choice(funcs)])[0]
    g = CompiledGrammar(schema_grammar(tool.parameters), bpe_vocab)
    m = Matcher(g)
    out = []
    stops = set(bpe_vocab.stop_ids)
    for _ in range(rnd.randint(5, 80)):
        if m.is_done():
            break
        legal = m.legal_token_ids()
        assert legal.size, f"dead end after {bpe_vocab.decode(out)!r}"
        t = pick_token(rnd, legal, bpe_vocab, stops)
        assert m.consume_token(t)
        if t not in stops:
            out.append(t)
    if not m.is_accepting():
        out += m.finish()
    value = json.loads(bpe_vocab.decode(out))
    jsonschema.validate(value, tool.parameters)


# -- fuzz: random (often broken) schemas compile or fail cleanly ------------------------------------

_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.floats(-10, 10, allow_nan=False), st.text(max_size=6),
    st.sampled_from(["string", "integer", "number", "object", "array", "boolean", "null", "#", "#/$defs/a",
                     "^a+$", "[", "(?=x)", "date", "email", "\\d{2,}", "#/properties/x"]),
)
_keys = st.sampled_from([
    "type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems",
    "minItems", "maxItems", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref", "$defs", "not", "minProperties",
    "maxProperties", "uniqueItems", "$anchor", "$id", "x-unknown", "patternProperties", "propertyNames",
])
_schemas = st.recursive(
    _leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_keys | st.text(max_size=3), inner, max_size=4)),
    max_leaves=20,
)


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(_schemas, st.booleans())
def test_fuzzed_schemas_compile_or_fail_cleanly(bytes_vocab, schema, lenient):
    opts = SchemaOptions(lenient=lenient, time_budget_s=2.0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g = schema_grammar(schema, opts)
            cg = CompiledGrammar(g, bytes_vocab)
    except (GrammarError, MatcherError):  # MatcherError: a grammar that matches nothing
        return
    m = Matcher(cg)
    rng = random.Random(0)
    for _ in range(30):  # a short walk: masks and steps must not raise either
        if m.is_done():
            break
        legal = m.legal_token_ids()
        assert legal.size, f"dead end in {schema!r}"
        assert m.consume_token(int(legal[rng.randrange(legal.size)]))


def test_an_older_draft_runs_with_its_own_schema_uri():
    """`railcall coverage --draft 7`: the draft7 folder, each schema given draft-07's `$schema`
    where it names none, both engines in one run, no crash."""
    files = dict(coverage.suite_files(JSTS, "7"))
    assert "ref" in files and "definitions" in files and all("draft7" in str(p) for p in files.values())
    assert coverage.with_draft({"type": "integer"}, "4")["$schema"] == "http://json-schema.org/draft-04/schema#"
    assert coverage.with_draft({"$schema": "x"}, "4") == {"$schema": "x"} and coverage.with_draft(True, "4") is True
    seen = []

    class Spy(coverage.RailcallChecker):
        def compile(self, schema):
            seen.append(schema)
            return super().compile(schema)

    t = coverage.run_file(Spy(), files["maximum"], "7")
    assert t.crashes == 0 and t.compiled == t.schemas and t.passed == t.tests
    assert seen and all(s.get("$schema", "").startswith("http://json-schema.org/draft-07") for s in seen if isinstance(s, dict))


# -- schemas whose keywords once failed together: random walks end in values jsonschema accepts ----

_D4 = "http://json-schema.org/draft-04/schema#"
_COMBINED = [
    {"type": "string", "enum": ["S", "XXL", "M"], "maxLength": 2},
    {"enum": [1, 10, 3, "x"], "maximum": 5},
    {"allOf": [{"enum": [1, 2, 3]}, {"minimum": 2}]},
    {"type": "object", "properties": {"size": {"enum": ["S", "XXL"], "maxLength": 2}, "n": {"const": 4, "minimum": 3}},
     "required": ["size"]},
    {"type": "integer", "minimum": 5 * 10**22},
    {"type": "integer", "maximum": -(10**22) - 3},
    {"$schema": _D4, "allOf": [{"maximum": 10, "exclusiveMaximum": False}, {"maximum": 5, "exclusiveMaximum": True}]},
    {"type": "string", "minLength": 2, "maxLength": 3},
    {"type": "object", "properties": {"a": {"type": "string", "nullable": True, "x-order": 1}}, "required": ["a"]},
]
# what jsonschema, which knows no OpenAPI, checks in place of a schema with `nullable`
_AS_JSON_SCHEMA = {8: {"type": "object", "properties": {"a": {"type": ["string", "null"]}}, "required": ["a"]}}


@settings(max_examples=90, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.sampled_from(range(len(_COMBINED))), st.randoms(use_true_random=False))
def test_walks_through_combined_keywords_validate(bytes_vocab, i, rnd):
    schema = _COMBINED[i]
    m = Matcher(CompiledGrammar(schema_grammar(schema, SchemaOptions(standard=True)), bytes_vocab))
    out: list[int] = []
    stops = set(bytes_vocab.stop_ids)
    for _ in range(80):  # uniform over the legal tokens: every value, and every prefix, is reachable
        legal = m.legal_token_ids()
        assert legal.size, f"dead end after {bytes_vocab.decode(out)!r}"
        go = [t for t in legal.tolist() if t not in stops]
        if not go or (m.is_accepting() and rnd.random() < 0.3):
            break
        t = rnd.choice(go)
        assert m.consume_token(t)
        out.append(t)
    if not m.is_accepting():
        out += m.finish()
    value = json.loads(bytes_vocab.decode(out))
    check = _AS_JSON_SCHEMA.get(i, schema)
    jsonschema.validators.validator_for(check)(check).validate(value)
