"""The runtime around the engine: what turns a grammar's masks into a decoded answer.

- `decode`: one sequence's step (forced tokens, mask, sampling, stop strings, the token
  ceiling) and the single-sequence loop that drives it;
- `batch`: many sequences in one forward pass (continuous batching, the prefix cache);
- `regions`: free text until a trigger, then the grammar (tool_choice auto);
- `output`: the parser that reads a reply back into text, reasoning and tool calls;
- `prompt`: the system prompt that shows the model its tools and the call format;
- `routing`: tool choice by whole-name likelihood.

Nothing is imported here, so importing one module does not load the others.
"""
