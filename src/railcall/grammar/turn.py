"""A turn's shape as a grammar construct: free text, tagged parts inside it, reasoning first.

A chat turn is rarely one grammar from its first token. A model given tools under tool_choice
"auto" writes prose and, somewhere in it, a call; a reasoning model thinks before it answers; a
structural tag (the `structural_tag` response format of vLLM and SGLang, after XGrammar) lets
free text carry parts such as `<function=get_weather>{"city": "Oslo"}</function>`, each under
its own schema. `Turn` says such a shape; `railcall.matcher.turn` compiles it against a
vocabulary into masks, and the decode loop cannot tell its matcher from a grammar's.

    Turn(body, reasoning=None, delimiters=())

    body        an ir.Grammar: the whole answer under it
                Free(tags): free text in which a tag's trigger starts the tag's grammar; when
                that grammar ends, free text again. The turn may end (a stop token) only in free
                text. Free() is plain text.
    reasoning   Reasoning(close, open=None, budget=None): a reasoning region first, ended by
                `close` -- by its token where the vocabulary has one token for it (the text
                spelled in pieces is reasoning), else by its text. `open`: the turn writes the
                open delimiter (one special token) itself; None: the prompt already opened it.
                `budget`: tokens of reasoning before the close is forced.
    delimiters  the texts a reply's reader takes as delimiters wherever their one token is
                generated (`railcall.output.Delimiters`): in free text such a token is legal only
                where it is an exit; inside a grammar it is its text, legal wherever that is.

    Tag(trigger, grammar)              `grammar` starts with the trigger
    Trigger(text, token=False, gaps)   the text that starts a tag, anywhere in free text; with
                                       `token`, only its one token does (the text spelled in
                                       pieces stays free text); `gaps`: positions p of the text
                                       where a run of JSON whitespace may stand before text[p]

A trigger's text is handed to its grammar in its compact spelling, then whatever followed the
trigger inside the token that completed it: a token is legal only if that remainder is a legal
start of the grammar. `structural_tag()` builds a Free body from the structural-tag format.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Union

from railcall.errors import GrammarError
from railcall.grammar import ir
from railcall.grammar.schema import schema_grammar


@dataclass(frozen=True)
class Trigger:
    text: str
    token: bool = False
    gaps: frozenset = frozenset()

    def __post_init__(self):
        if not isinstance(self.text, str) or not self.text:
            raise GrammarError(f"a trigger is a non-empty text, not {self.text!r}")
        bad = [p for p in self.gaps if not 0 < p < len(self.text)]
        if bad:
            raise GrammarError(f"trigger {self.text!r}: whitespace gaps must lie inside the text (1..{len(self.text) - 1}), "
                               f"not {sorted(bad)}")


@dataclass(frozen=True)
class Tag:
    trigger: Trigger
    grammar: ir.Grammar


@dataclass(frozen=True)
class Free:
    tags: tuple = ()  # (Tag, ...)

    def __post_init__(self):
        object.__setattr__(self, "tags", tuple(self.tags))
        texts = [t.trigger.text for t in self.tags if not t.trigger.token]
        for a in texts:
            for b in texts:
                if a != b and a in b:
                    raise GrammarError(f"trigger {b!r} contains trigger {a!r}, which would always start first; "
                                       "drop one, or make them differ")
        if len(set(texts)) != len(texts):
            raise GrammarError("two tags have the same trigger; give the trigger one grammar (an alternation)")


@dataclass(frozen=True)
class Reasoning:
    close: str
    open: str | None = None
    budget: int | None = None

    def __post_init__(self):
        if not self.close or (self.open is not None and not self.open):
            raise GrammarError("reasoning delimiters are non-empty texts")
        if self.budget is not None and self.budget < 0:
            raise GrammarError(f"the reasoning budget must be >= 0 tokens, not {self.budget}")


@dataclass(frozen=True)
class Turn:
    body: Union[ir.Grammar, Free]
    reasoning: Reasoning | None = None
    delimiters: tuple = ()  # texts
    key: str = field(default="", compare=False)

    def __post_init__(self):
        if not isinstance(self.body, (ir.Grammar, Free)):
            raise GrammarError(f"a turn's body is an ir.Grammar or a Free, not {type(self.body).__name__}")
        object.__setattr__(self, "delimiters", tuple(self.delimiters))
        if not self.key:
            body = (self.body.key if isinstance(self.body, ir.Grammar) else
                    tuple((t.trigger, t.grammar.key) for t in self.body.tags))
            digest = hashlib.sha256(repr((body, self.reasoning, self.delimiters)).encode()).hexdigest()[:24]
            object.__setattr__(self, "key", digest)

    @property
    def grammars(self) -> list[ir.Grammar]:
        """Every grammar the turn runs, in order: the body's, or each tag's."""
        return [self.body] if isinstance(self.body, ir.Grammar) else [t.grammar for t in self.body.tags]


def structural_tag(structures, triggers) -> Free:
    """Free text with tagged parts, in the structural-tag format: `structures` are
    (begin, grammar, end) -- a part is `begin`, then text under `grammar` (an ir.Grammar, say a
    schema's), then `end` -- and `triggers` are texts each `begin` starts with. Once a trigger
    is written, one of the structures that begin with it must follow."""
    structures, triggers = list(structures), list(triggers)
    if not structures:
        raise GrammarError("a structural tag needs at least one structure")
    if not triggers or not all(isinstance(t, str) and t for t in triggers):
        raise GrammarError("a structural tag needs at least one trigger, each a non-empty text")
    parts: dict[str, list] = {t: [] for t in triggers}
    for i, (begin, grammar, end) in enumerate(structures):
        if not isinstance(begin, str) or not begin or not isinstance(end, str):
            raise GrammarError(f"structures[{i}]: begin must be a non-empty text and end a text")
        owner = [t for t in triggers if begin.startswith(t)]
        if not owner:
            raise GrammarError(f"structures[{i}]: begin {begin!r} starts with none of the triggers {triggers!r}; "
                               "every structure's begin starts with a trigger")
        node, rules = ir.prefix_rules(grammar.start, grammar.rules, f"s{i}")
        parts[max(owner, key=len)].append((ir.Seq(ir.Lit(begin.encode()), node, ir.Lit(end.encode())), rules,
                                          grammar.tail_calls))
    tags = []
    for t in triggers:
        if not parts[t]:
            raise GrammarError(f"trigger {t!r} begins no structure; every trigger starts some structure's begin")
        nodes = [p[0] for p in parts[t]]
        rules = tuple(r for p in parts[t] for r in p[1])
        start = nodes[0] if len(nodes) == 1 else ir.Alt(*nodes)
        tags.append(Tag(Trigger(t), ir.Grammar(start, rules, name=f"tag:{t}", tail_calls=any(p[2] for p in parts[t]))))
    return Free(tuple(tags))


TAG_SHAPE = '{"structures": [{"begin": "...", "schema": {...}, "end": "..."}, ...], "triggers": ["..."]}'


def structural_tag_json(tag) -> Free:
    """`structural_tag()` from the format's JSON object (as vLLM's plug-in spec and the
    benchmarks carry it): each structure's schema (default: any JSON value) compiled as JSON
    Schema; a GrammarError naming the structure where the object has the wrong shape."""
    if not isinstance(tag, dict) or not isinstance(tag.get("structures"), list) \
            or not isinstance(tag.get("triggers"), list):
        raise GrammarError(f"structural_tag must be {TAG_SHAPE}")
    parts = []
    for i, st in enumerate(tag["structures"]):
        if not isinstance(st, dict) or not isinstance(st.get("begin"), str) or not isinstance(st.get("end"), str):
            raise GrammarError(f'structural_tag.structures[{i}] must be {{"begin": "...", "schema": {{...}}, "end": "..."}}')
        parts.append((st["begin"], schema_grammar(st.get("schema", True)), st["end"]))
    return structural_tag(parts, tag["triggers"])
