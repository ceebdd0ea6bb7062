"""Execution: what turns a grammar's masks into a decoded answer.

- `decode`: one sequence's step (forced tokens, mask, sampling, stop strings, the token
  ceiling, a call closed within the budget) and the single-sequence loop that drives it;
- `batch`: many sequences in one forward pass (continuous batching, fair admission, the prefix
  cache) over a model's batch (`models.backend.TransformersBatch`, `models.llama.LlamaBatch`);
- `regions`: free text until a trigger, then the grammar (tool_choice auto, reasoning);
- `distinct`: no call identical to an earlier one in the same reply.

What the model is shown is in `railcall.prompts`, how a reply is read back in `railcall.output`,
choices made for the model beside the grammar in `railcall.heuristics`.
Nothing is imported here, so importing one module does not load the others.
"""
