"""railcall inside other runtimes: a Hugging Face logits processor (`hf`), a vLLM logits
processor (`vllm`) and a vLLM tool parser with its chat template (`vllm_tools`).

Nothing is imported here: each module needs its own runtime installed, and only that one.
"""
