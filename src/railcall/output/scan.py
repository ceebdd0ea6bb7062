"""A call body read as it arrives: where it ends (`CallBody`) and, for a streaming client, its
name and argument pieces (`CallScanner`). Neither validates: the parser reads the finished body
with `railcall.output.calls`."""

from __future__ import annotations

import json

from railcall.output.calls import Delta

class CallScanner:
    """Reads a call body (JSON text) as it arrives and says what a streaming client may see: the
    name once its string is complete, then the arguments piece by piece. The body is one call
    object, or an array of them (the JSON format's parallel calls). Per call being read.

    A scanner does not validate: it runs where the grammar already holds the body to a call
    (`OutputParser(stream_calls=True)`), and the parser validates the whole at the call's end.
    """

    def __init__(self, keys: tuple[str, str], first: int, text_tools: frozenset[str] = frozenset()):
        self.name_key, self.args_key = keys
        self.text_tools = text_tools  # custom tools: their arguments are one string, streamed as written
        self.first = first  # the turn's index of the body's first call
        self.calls: list[list] = []  # [name or None, args text, args complete]
        self.depth = 0
        self.in_str = self.esc = False
        self.base: int | None = None  # depth of a call object's members: 1 (an object), 2 (an array)
        self.key: str | None = None  # the member being read at the call's top level
        self.expect_key = False
        self.text = ""  # the current string's raw text (a key or the name)
        self.args_from: int | None = None  # depth the arguments value opened at
        self.args_string = False  # arguments written as a JSON string: streamed only for a custom tool
        self.out: list[Delta] = []
        self.held: dict[int, str] = {}  # arguments read before the name (sent once it is known)

    def feed(self, c: str) -> None:
        top = self.base is not None and self.depth == self.base
        if self.in_str:
            self._arg(c)
            if self.esc:
                self.esc = False
                self.text += c
            elif c == "\\":
                self.esc = True
                self.text += c
            elif c == '"':
                self.in_str = False
                if self.args_from is not None and self.args_from == self.depth and self.args_string:
                    self.calls[-1][2] = True  # a custom tool's input string closed
                    self.args_from = None
                elif top and self.expect_key:
                    self.key, self.expect_key = _str(self.text), False
                elif top and self.key == self.name_key and self.calls and self.calls[-1][0] is None:
                    name = _str(self.text)
                    self.calls[-1][0] = name
                    k = len(self.calls) - 1
                    self.out.append(Delta("call_name", name, index=self.first + k))
                    if self.held.get(k):
                        self.out.append(Delta("call_args", self.held.pop(k), index=self.first + k))
            else:
                self.text += c
            return
        if c in " \t\r\n":
            return
        if self.base is None:
            self.base = 1 if c == "{" else 2
        if c == '"':
            self.in_str, self.text = True, ""
            if top and self.key == self.args_key and self.args_from is None and not self.expect_key:
                self.args_string = True
                if self.calls and self.calls[-1][0] is not None and self.calls[-1][0] in self.text_tools:
                    self.args_from = self.depth  # the input's JSON string, streamed quotes and all
            self._arg(c)
        elif c in "{[":
            if top and self.key == self.args_key and self.args_from is None:
                self.args_from = self.depth
            self._arg(c)
            self.depth += 1
            if c == "{" and self.depth == self.base:  # a call object opens
                self.calls.append([None, "", False])
                self.key, self.expect_key, self.args_from, self.args_string = None, True, None, False
        elif c in "}]":
            self._arg(c)
            self.depth -= 1
            if self.args_from is not None and self.depth == self.args_from:
                self.calls[-1][2] = True
                self.args_from = None
        elif c == "," and top:
            self.key, self.expect_key = None, True
        else:
            self._arg(c)

    def _arg(self, c: str) -> None:
        """Append c to the call's arguments if it is part of them (inside the arguments object)."""
        if self.args_from is None or not self.calls or self.calls[-1][2]:
            return
        call = self.calls[-1]
        call[1] += c
        k = len(self.calls) - 1
        if call[0] is None:
            self.held[k] = self.held.get(k, "") + c
        elif self.out and self.out[-1].kind == "call_args" and self.out[-1].index == self.first + k:
            self.out[-1] = Delta("call_args", self.out[-1].text + c, index=self.first + k)
        else:
            self.out.append(Delta("call_args", c, index=self.first + k))

    def take(self) -> list[Delta]:
        out, self.out = self.out, []
        return out


def _str(raw: str) -> str:
    try:
        return json.loads('"' + raw + '"')
    except ValueError:
        return raw


class CallBody:
    """One call being read: the text that opened it, its body so far, and where the body ends.
    A Hermes body ends at its close delimiter (the parser's to find: `add` takes all of it); a
    JSON body where its outermost value closes; a pythonic list at its closing bracket. Brackets
    inside strings do not count (a pythonic string opens with either quote). For the JSON
    formats a `CallScanner` reads the same characters, for streaming clients."""

    def __init__(self, mode: str, opener: str, keys: tuple[str, str], first: int,
                 text_tools: frozenset[str] = frozenset()):
        self.mode, self.opener, self.text = mode, opener, ""
        self.depth, self.quote, self.esc = 0, "", False
        self.scanner = None if mode == "pythonic" else CallScanner(keys, first, text_tools)
        pythonic = mode == "pythonic"
        self._quotes = "\"'" if pythonic else '"'
        self._opens, self._closes = ("([{", ")]}") if pythonic else ("{[", "}]")

    def add(self, text: str) -> tuple[int, bool]:
        """Take `text` up to the body's end: (characters taken, whether the body ended there)."""
        sc = self.scanner
        if self.mode == "hermes":
            self.text += text
            for c in text:
                sc.feed(c)
            return len(text), False
        for i, c in enumerate(text):
            self.text += c
            if sc is not None:
                sc.feed(c)
            if self.quote:
                if self.esc:
                    self.esc = False
                elif c == "\\":
                    self.esc = True
                elif c == self.quote:
                    self.quote = ""
            elif c in self._quotes:
                self.quote = c
            elif c in self._opens:
                self.depth += 1
            elif c in self._closes:
                self.depth -= 1
                if self.depth <= 0:
                    return i + 1, True
        return len(text), False

    def pieces(self) -> list[Delta]:
        """The name and argument pieces read since the last call (none for a pythonic list)."""
        return [] if self.scanner is None else self.scanner.take()
