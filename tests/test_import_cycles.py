"""Every import points down: each package of railcall sits on a floor (`FLOORS`, from the ground
floor of paths, digests and errors up to the command line), no module imports from a floor above
its own, and no two modules import each other, directly or round a loop. Read from the source
(ast), so it needs no optional package and imports nothing.

Every import counts, at the top of a module or deferred inside a function or an
`if TYPE_CHECKING:` block: a deferred import still ties the two modules into one unit a reader
(and Cython, for the compiled ones) has to hold together.
"""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# The cycles still to break, each as its sorted list of modules. A new one fails the test; one
# that is gone must leave this list too.
ALLOWED: list[list[str]] = []


def modules() -> dict[str, Path]:
    found = {}
    for path in (SRC / "railcall").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The railcall modules `name` imports anywhere in its source. `from a.b import c` imports
    a.b, and a.b.c too where c is a module; relative imports are resolved against the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            subs = [f"{base}.{a.name}" for a in node.names]
            # `from railcall import speedups` imports the module, not the package's own names
            targets = [s for s in subs if s in known] + ([base] if any(s not in known for s in subs) else [])
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def test_the_finder_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_deferred_imports():
    graph = import_graph()
    assert "railcall.eval.results" in graph["railcall.eval.report"]
    assert "railcall.eval.report" in graph["railcall.eval.runner"]  # imported inside run_bfcl


def test_no_import_cycles_beyond_the_known_ones():
    assert cycles(import_graph()) == sorted(ALLOWED)


# The floors, bottom up: a module may import from its own floor and the ones below. A package
# (or top-level module) not listed fails the test, so a new one is placed on purpose.
FLOORS: list[tuple[str, ...]] = [
    ("errors", "version", "home", "atomic", "bitmask", "speedups", "gguf", "data"),  # ground: no railcall import above
    ("vocab",),  # token bytes; knows nothing of grammars or models
    ("grammar",),  # tool tables and schemas -> grammar IR -> byte programs
    ("matcher",),  # the automaton and its masks, per vocabulary
    ("prompts", "output", "heuristics"),  # what the model is shown; reading replies; choices beside the grammar
    ("models",),  # model files and backends (transformers, llama.cpp)
    ("runtime",),  # execution: the decode step, batching, regions
    ("agent", "integrations", "server"),  # surfaces over the runtime
    ("demo",),
    ("eval", "bench"),  # measurement over the surfaces
    ("cli", "railcall"),  # the command line, and the package's public surface (`railcall/__init__.py`)
]


def floor_of(module: str) -> int:
    part = module.split(".")[1] if "." in module else "railcall"
    for level, names in enumerate(FLOORS):
        if part in names:
            return level
    raise AssertionError(f"{module}: its package {part!r} has no floor in FLOORS; place it there")


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, bs in graph.items() for b in bs if floor_of(b) > floor_of(a))


def test_the_floor_check_sees_an_upward_import():
    assert upward({"railcall.vocab": {"railcall.models.store"}, "railcall.models.store": {"railcall.vocab"}}) == [
        ("railcall.vocab", "railcall.models.store")]
    assert upward({"railcall.runtime.batch": {"railcall.models.backend"}}) == []


def test_no_import_points_up_a_floor():
    assert upward(import_graph()) == []
