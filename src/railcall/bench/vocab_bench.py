"""Vocabulary build times: cold (from the tokenizer) and from the disk cache, per vocabulary.

Run in a subprocess per vocabulary with an empty `RAILCALL_HOME/vocab`, so "cold" really is
cold and "cached" reads what the cold build wrote. Prints one JSON record.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time


def measure(name: str) -> dict:
    from tokenizers import Tokenizer

    from railcall.matcher import prepare_vocabulary
    from railcall.models.store import embedded_gguf_path, tokenizer_folder
    from railcall.vocab import Vocabulary

    folder = tokenizer_folder(name, log=lambda m: print(m, file=sys.stderr))
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    home = tempfile.mkdtemp(prefix="railcall-vocab-bench-")
    os.environ["RAILCALL_HOME"] = home
    t0 = time.perf_counter()
    v = Vocabulary.from_hf(tok, name=name)  # cold: builds and writes the cache
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    v2 = Vocabulary.from_hf(tok, name=name)  # from the disk cache
    cached = time.perf_counter() - t0
    assert v2.token_bytes == v.token_bytes
    t0 = time.perf_counter()
    Vocabulary.from_gguf(embedded_gguf_path(name), cache=False)
    gguf = time.perf_counter() - t0
    t0 = time.perf_counter()
    prepare_vocabulary(v2)
    prepare = time.perf_counter() - t0
    return {"vocab": name, "tokens": v.size, "build_cold_s": cold, "build_cached_s": cached,
            "build_from_gguf_s": gguf, "engine_indexes_s": prepare}


if __name__ == "__main__":
    print("RESULT " + json.dumps(measure(sys.argv[1])))
