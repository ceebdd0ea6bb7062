"""A scripted model for agent tests: a byte vocabulary and a backend whose logits prefer the
next byte of a scripted reply, so the grammar's mask still decides what is written."""

from __future__ import annotations

from railcall.agent.loop import AgentModel
from railcall.vocab import Vocabulary

END = "<|end|>"


def byte_vocab() -> Vocabulary:
    return Vocabulary.from_pieces([bytes([b]) for b in range(256)], specials=[END], stop=[END], name="agent-bytes")


class ScriptedBackend:
    """Each start() takes the next reply of the script; logits favour the reply's next byte
    (10.0), then the stop token (1.0), then every other token by a tiny descending ramp."""

    def __init__(self, vocab: Vocabulary, replies):
        import torch

        self.vocab, self.replies = vocab, list(replies)
        self.width = vocab.logits_width
        self.base = -torch.arange(self.width, dtype=torch.float32) * 1e-3
        self.prompts: list[list[int]] = []
        self.target, self.written = b"", b""

    def start(self, prompt):
        self.prompts.append(list(prompt))
        self.target = (self.replies.pop(0) if self.replies else "").encode()
        self.written = b""
        return self._logits()

    def feed(self, tokens):
        import torch

        rows = []
        for t in tokens:
            self.written += self.vocab.token_bytes[t]
            rows.append(self._logits())
        return torch.stack(rows)

    def branch_logits(self, branches):
        """Scored routing's scorer: each branch's logits as if fed, the reply left where it was."""
        import torch

        out, before = [], self.written
        for b in branches:
            rows = []
            for t in b:
                self.written += self.vocab.token_bytes[t]
                rows.append(self._logits())
            out.append(torch.stack(rows))
            self.written = before
        return out

    def _logits(self):
        out = self.base.clone()
        n = len(self.written)
        if self.target.startswith(self.written) and n < len(self.target):
            out[self.target[n]] = 10.0
        else:
            out[self.vocab.stop_ids[0]] = 1.0
        return out


def scripted_model(replies, renders=None) -> AgentModel:
    vocab = byte_vocab()

    def render(messages, tools):
        if renders is not None:
            renders.append(messages)
        return [0]

    return AgentModel(ScriptedBackend(vocab, replies), vocab, render, "scripted")
