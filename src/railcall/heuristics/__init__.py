"""Choices made for the model, beside the grammar. Each is a policy a caller turns on; none is
needed for a call to be well formed.

- `routing`: the tool name (and enumerated values) chosen by whole-name likelihood ("scored",
  the agent's default: it reads the model's logits, not the request), and `matching_tools`, a
  word-overlap choice among the tools (reads the request's words; opt-in, reported as its own
  row wherever a figure uses it);
- `grounding`: numbers stated in the request offered as a numeric argument's values (reads the
  request's words; opt-in, reported as its own row).

Nothing is imported here, so importing one module does not load the others.
"""
