"""What the model is shown: the system prompt that lists the tools and the call format, the
layout of a model without a chat template, and in-context examples.

- `chat`: `describe_tools`, `system_prompt`, `chat_prompt_ids` (a tokenizer's chat template over
  the system prompt and the request);
- `plain`: the Question/Answer layout installed as the chat template of a base model, and the
  stop strings that end its turn;
- `shots`: in-context example calls made from the tool table itself (placeholder arguments).

Prompts change what the model writes, never what it may write: that is the grammar's.
Nothing is imported here, so importing one module does not load the others.
"""
