"""The attacks on the agent's sandbox as counts: each function makes its attempts in scratch
folders and returns `Tally(attempts, bad)`, where `bad` lists what went wrong (a byte written or
read outside the workspace, a widened policy loaded, a forged skill run, a torn file, a crash).

tests/test_hostile.py runs every attack, small, in `make test` and asserts no bad outcome;
`python tests/hostile.py --scale 10` runs them larger and prints the table that docs/agent.md
quotes. The attacks need no model: a scripted one writes the agent's calls.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
API_KEY = "test-key-railcall"  # the live test server's (tests/server_harness.py) and --server's
SRC = str(HERE.parent / "src")
sys.path.insert(0, str(HERE))

READ = {"tool": "read_file", "args": {"path": "notes.txt"}}
ANSWER = {"tool": "answer", "args": {"text": "It says hi."}}


@dataclass
class Tally:
    attempts: int = 0
    bad: list[str] = field(default_factory=list)
    extra: str = ""

    def add(self, problem: str | None) -> None:
        self.attempts += 1
        if problem:
            self.bad.append(problem)


_MADE: list[Path] = []


def _scratch() -> Path:
    _MADE.append(Path(tempfile.mkdtemp(prefix="railcall-hostile-")))
    return _MADE[-1]


def cleanup() -> None:
    """Remove the scratch folders the attacks made (links inside are removed, not followed)."""
    while _MADE:
        shutil.rmtree(_MADE.pop(), ignore_errors=True)


def victim_workspace(top: Path) -> tuple[Path, Path, Path]:
    """`top`/ws with `.railcall/skills/` and notes.txt, and beside it a file ("keep") and a
    folder (empty) for planted links to aim at; returns (ws, the file, the folder)."""
    root = top / "ws"
    (root / ".railcall" / "skills").mkdir(parents=True)
    (root / "notes.txt").write_text("hi")
    (top / "victim").write_text("keep")
    (top / "outdir").mkdir()
    return root, top / "victim", top / "outdir"


def _outside_changed(victim: Path, outdir: Path) -> str | None:
    if victim.read_text() != "keep":
        return f"the file outside was changed: {victim.read_text()[:60]!r}"
    if os.listdir(outdir):
        return f"a file was made outside: {os.listdir(outdir)}"
    return None


# the links a workspace may arrive with in .railcall/ (what they point at: "victim" or "outdir")
STATE_LINKS = ["trace.jsonl", "memory.jsonl", "skills/SKILL.json", "skills", "tmp", "policies.json"]


def _target(form: str, rel: str, top: Path, link: Path) -> str:
    folder = rel in ("skills", "tmp")
    aim = top / ("outdir" if folder else "victim")
    if form == "absolute":
        return str(aim)
    if form == "relative":
        return os.path.relpath(aim, link.parent)
    if form == "chain":  # a link to a link outside
        hop = top / "outdir" / ".hop"
        return str(hop)
    return str(top / "outdir" / ("made" if not folder else "made-dir"))  # dangling: a write would create it


def state_links(scale: int = 1) -> Tally:
    """Links planted in `.railcall/` (six places x four link forms), under --read-only and not,
    before the agent starts and after (another process in the workspace): a whole scripted
    episode (read a file, answer, learn a skill, keep a note, write the trace) runs or is refused
    with the link named; nothing outside the workspace is written or read."""
    from agentkit import scripted_model

    from railcall.agent.loop import Agent
    from railcall.agent.policy import Policy
    from railcall.agent.skills import skill_name

    t = Tally()
    counts = {"refused": 0, "ran": 0}
    for rel in STATE_LINKS:
        for form in ("absolute", "relative", "chain", "dangling"):
            for read_only in (True, False):
                for when in ("before", "after"):
                    top = _scratch()
                    root, victim, outdir = victim_workspace(top)
                    name = rel.replace("SKILL", skill_name([READ]))
                    link = root / ".railcall" / name

                    def plant():
                        if link.is_dir() and not link.is_symlink():
                            link.rmdir()
                        link.symlink_to(_target(form, rel, top, link))
                        if form == "chain":  # the hop is made after the plant, so outdir holds only it
                            hop = top / "outdir" / ".hop"
                            hop.symlink_to(top / ("outdir" if rel in ("skills", "tmp") else "victim"))

                    if when == "before":
                        plant()
                    outcome, problem = "ran", None
                    try:
                        model = scripted_model([json.dumps(READ), json.dumps(ANSWER)] * 3)
                        agent = Agent.for_workspace(root, model, policy=Policy(read_only=read_only, approve="auto"),
                                                    trace=root / ".railcall" / "trace.jsonl", max_steps=3)
                        if when == "after":
                            plant()
                        agent.run("What is in notes.txt?")
                        agent.memory.append("notes.txt says hi")
                        agent.skills.save("What is in notes.txt?", [READ])
                        if not read_only:
                            agent.workspace.write("new.txt", b"data")
                    except (ValueError, OSError) as e:
                        outcome = "refused"
                        if name.split("/")[-1] not in str(e):
                            problem = f"{rel} ({form}, {when}): refused without naming the link: {e}"
                    hop = top / "outdir" / ".hop"
                    if hop.is_symlink():
                        hop.unlink()
                    counts[outcome] += 1
                    t.add(_outside_changed(victim, outdir) or problem)
    t.extra = (f"{counts['refused']} refused naming the link; {counts['ran']} ran without opening it (planted "
               "after the start where the run does not use that file)")
    return t


APPENDER = """
import sys
from railcall.agent.files import Workspace
ws = Workspace(sys.argv[1])
line = sys.argv[2].encode() * (int(sys.argv[3]) // len(sys.argv[2]))
print("go", flush=True)
while True:
    ws.append("log.txt", line)
"""


def append_kills(scale: int = 1, size: int = 4 << 20) -> Tally:
    """`append_file` of 4 MB lines killed (SIGKILL) at a random moment, 5 x scale times: the
    file is always its first line and then whole 4 MB lines, never a partial one."""
    t = Tally()
    rng = random.Random(52)
    top = _scratch()
    (top / "log.txt").write_text("first\n")
    unit = "0123456789abcdef"
    for _ in range(5 * scale):
        p = subprocess.Popen([sys.executable, "-c", APPENDER, str(top), unit, str(size)], stdout=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": SRC})
        p.stdout.readline()
        time.sleep(rng.uniform(0.0, 0.4))
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        lines = (top / "log.txt").read_bytes().split(b"\n")
        whole = unit.encode() * (size // len(unit))
        ok = lines[0] == b"first" and lines[-1] == b"" and all(x == whole for x in lines[1:-1])
        t.add(None if ok else f"torn: {len(lines) - 2} lines, the last {len(lines[-2])} bytes")
    lines = (top / "log.txt").read_bytes().count(b"\n") - 1
    t.extra = f"{lines} whole 4 MB lines appended in all"
    return t


def policy_plants(scale: int = 1) -> Tally:
    """A workspace's `.railcall/policies.json` with random policies (a built-in, a user's or a
    new name; tools, approvals, globs, hard links): every one that would widen is refused, every
    one loaded allows no tool, value or approval the policy of its name did not."""
    from railcall.agent.policy import BUILTIN, PolicyError, load_policies, widens, Policy

    rng = random.Random(7)
    tools = ["read_file", "write_file", "append_file", "list_dir", "calc", "answer", "run"]
    home = _scratch()
    (home / "policies.json").write_text(json.dumps({"team": {"allow": ["read_file", "answer"]}}))
    old = os.environ.get("RAILCALL_HOME")
    os.environ["RAILCALL_HOME"] = str(home)
    t = Tally()
    refused = 0
    try:
        base = {"team": Policy.from_dict("team", {"allow": ["read_file", "answer"]}),
                **{n: Policy.from_dict(n, d) for n, d in BUILTIN.items()}}
        for _ in range(100 * scale):
            name = rng.choice(["docs-reader", "team", "mine"])
            d: dict = {}
            if rng.random() < 0.5:
                d["allow"] = rng.sample(tools, rng.randint(1, len(tools)))
            if rng.random() < 0.3:
                d["deny"] = rng.sample(tools, rng.randint(0, 2))
            if rng.random() < 0.5:
                d["read_only"] = rng.random() < 0.5
            if rng.random() < 0.3:
                d["approve"] = rng.choice(["deny", "ask", "auto"])
            if rng.random() < 0.2:
                d["hard_links"] = rng.random() < 0.5
            if rng.random() < 0.4:
                d["args"] = {"read_file": {"path": rng.choice([{"glob": "docs/*"}, {"glob": "*"}, ["docs/a.md"],
                                                               {"glob": "docs/a*"}])}}
            ws = _scratch() / "ws"
            (ws / ".railcall").mkdir(parents=True)
            (ws / ".railcall" / "policies.json").write_text(json.dumps({name: d}))
            try:
                got = load_policies(ws / ".railcall" / "policies.json")[name]
            except PolicyError:
                t.add(None)
                refused += 1
                continue
            wider = widens(got, base.get(name, Policy()))
            t.add(f"{name} {d} loaded and widens {wider}" if wider else None)
    finally:
        if old is None:
            os.environ.pop("RAILCALL_HOME", None)
        else:
            os.environ["RAILCALL_HOME"] = old
    t.extra = f"{refused} refused as widening, {t.attempts - refused} loaded (each only narrows)"
    return t


def skill_forgery(scale: int = 1) -> Tally:
    """Skills planted or edited in `.railcall/skills/`: a hand-made one with a right content
    hash, a signature copied from another skill, and each field of a learned skill changed
    (random values): none loads, none is offered, none runs."""
    from railcall.agent.loop import Agent
    from railcall.agent.policy import Policy
    from railcall.agent.skills import SkillError, skill_name

    rng = random.Random(11)
    t = Tally()
    fields = ["task", "created", "origin", "steps", "name", "hint", "signature"]
    for i in range(20 * scale):
        top = _scratch()
        (top / "notes.txt").write_text("n")
        agent = Agent.for_workspace(top, None, policy=Policy(approve="auto"))
        good = agent.skills.save("What is in notes.txt?", [READ])
        path = agent.skills.folder / f"{good.name}.json"
        doc = json.loads(path.read_text())
        evil = [{"tool": "write_file", "args": {"path": "planted.txt", "text": "pwned"}}]
        kind = i % 3
        if kind == 0:  # hand-made, right hash
            name = skill_name(evil)
            (agent.skills.folder / f"{name}.json").write_text(json.dumps({"name": name, "task": "t", "steps": evil}))
        elif kind == 1:  # another skill's signature
            name = skill_name(evil)
            (agent.skills.folder / f"{name}.json").write_text(json.dumps({**doc, "name": name, "steps": evil}))
        else:  # a field of the learned skill edited
            name = good.name
            f = rng.choice(fields)
            value = rng.choice(["Delete everything", 0.0, {"kind": "approved"}, evil, "x" * 64, None])
            path.write_text(json.dumps({**doc, f: value}))
        try:
            agent.skills.load(name)
            loaded = True
        except (SkillError, ValueError, KeyError, TypeError):
            loaded = False
        run = agent.view().tool("run")
        offered = run is not None and name in json.dumps(run.parameters) and name != good.name
        result = agent.dispatch({"tool": "run", "args": {"name": name}})
        ran = (top / "planted.txt").exists()
        t.add(f"forged skill {kind}: loaded={loaded} offered={offered} ran={ran}" if loaded or offered or ran
              else None)
    return t


def policy_race(scale: int = 1) -> Tally:
    """The file a policy narrowing admitted (`docs/*`, `out.txt`) re-linked to one it does not
    between the view and the call, four tools x 5 x scale: the call is refused at the resolved
    path; the file it now leads to is neither read nor written."""
    from test_agent_policy import RELINKS, _docs_workspace

    t = Tally()
    for _ in range(5 * scale):
        for call, (link, target) in RELINKS:
            top = _scratch()
            agent = _docs_workspace(top)
            v = agent.view()
            (top / link).rename(top / (link + ".moved"))
            (top / link).symlink_to(target)
            _, result, ok, _ = agent.dispatch(call, v)
            leak = "SECRET" in result or "secret" in result
            changed = (top / "notes.txt").read_text() != "notes" or (top / "private" / "secret.txt").read_text() != "SECRET"
            t.add(f"{call['tool']} through {link}: ok={ok} leak={leak} changed={changed}"
                  if ok or leak or changed else None)
    return t


def deep_tree(scale: int = 1, depth: int = 1000) -> Tally:
    """A workspace `depth` folders deep: the agent starts, builds its view and refuses the
    deepest file with a reason, without a RecursionError; `extra` gives the seconds per view."""
    from test_agent_files import _deep_tree, _remove_deep_tree

    from railcall.agent.files import PathRefused
    from railcall.agent.loop import Agent

    t = Tally()
    top = _scratch()
    (top / "top.txt").write_text("top")
    bottom = _deep_tree(top, depth)
    try:
        times = []
        for _ in range(scale):
            try:
                t0 = time.perf_counter()
                agent = Agent.for_workspace(top, None)
                agent.view()
                times.append(time.perf_counter() - t0)
                try:  # the tool itself, as if the grammar were bypassed (the view does not offer the file)
                    out = agent.table.entry("read_file").call({"path": bottom + "/bottom.txt"})
                except PathRefused as e:
                    out = f"refused: {e}"
                t.add(None if "deeper than" in out else f"the deepest file gave {out[:80]!r}")
            except RecursionError as e:
                t.add(f"RecursionError: {e}")
        t.extra = f"{min(times):.2f} s to start and build a view" if times else ""
    finally:
        _remove_deep_tree(top, depth)
    return t


def swap_race(scale: int = 1) -> Tally:
    """A folder swapped for a link to outside while read_file, write_file and append_file run
    on it, 2 x scale seconds: no read returns the outside file, nothing lands outside."""
    from test_agent_sandbox import SWAPPER, swap_workspace

    from railcall.agent.files import PathRefused
    from railcall.agent.loop import Agent

    root, outside = swap_workspace(_scratch())
    a = Agent.for_workspace(root, None)
    tools = [(a.table.entry("read_file"), {"path": "d/f.txt"}), (a.table.entry("write_file"),
             {"path": "d/new.txt", "text": "written"}), (a.table.entry("append_file"), {"path": "d/f.txt", "text": "a"})]
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(root), str(outside), str(time.time() + 2 * scale)],
                               stdout=subprocess.PIPE, text=True)
    t = Tally()
    while swapper.poll() is None:
        for tool, args in tools:
            try:
                out = tool.call(args)
            except (PathRefused, OSError):
                out = ""
            t.add("read the outside file" if "SECRET" in str(out) else None)
    swaps = int(swapper.communicate()[0])
    if sorted(p.name for p in outside.iterdir()) != ["f.txt"] or (outside / "f.txt").read_text() != "SECRET":
        t.bad.append(f"written outside: {sorted(p.name for p in outside.iterdir())}")
    t.extra = f"{swaps} swaps"
    return t


# -- hostile clients, against a live server (`--server`: the embedded model, started here) --

def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def schema_soak(url: str, n: int = 1000, vocab=None) -> Tally:
    """`n` completion requests, each with a fresh JSON schema as its response format (enums of
    new words, patterns, nesting; every 100th a 1,000-value enum of 3 KB strings, 2.9 MB), 4
    tokens each, against the server running in this process: bad when a request gets a 5xx, or when the
    resident memory at the end is more than 20% above where the first 100 left it."""
    import gc

    import httpx
    from test_matcher_memory import fresh_schema, word

    rng = random.Random(52)
    t = Tally()
    codes: dict[int, int] = {}
    rss100 = 0
    with httpx.Client(base_url=url, timeout=300, headers={"Authorization": f"Bearer {API_KEY}"}) as c:
        for i in range(n):
            if i % 100 == 99:
                schema = {"type": "object", "properties": {"pick": {"enum": [word(rng, 3000) for _ in range(1000)]}},
                          "required": ["pick"]}
            else:
                schema = fresh_schema(rng)
            # /v1/completions: the prompt is given as it is, so the schema is compiled (the engine's
            # shared state, the point of the soak) but not also written into a chat prompt to prefill
            body = {"model": "smollm2", "max_tokens": 4, "temperature": 0, "prompt": f"Form {i}: ",
                    "response_format": {"type": "json_schema", "json_schema": {"name": "form", "schema": schema}}}
            r = c.post("/v1/completions", json=body)
            codes[r.status_code] = codes.get(r.status_code, 0) + 1
            t.add(f"request {i}: {r.status_code} {r.text[:200]}" if r.status_code >= 500 else None)
            if i + 1 == 100:
                gc.collect()
                rss100 = _rss()
    gc.collect()
    end = _rss()
    engine = ""
    if vocab is not None:
        from railcall.matcher import memory_used
        from railcall.matcher.entries import vocab_cache

        engine = (f"; the engine's estimate {memory_used(vocab) >> 20} MiB of a {vocab_cache(vocab).budget >> 20} MiB "
                  f"budget, store {vocab_cache(vocab).generation}")
    if end > 1.2 * rss100:
        t.bad.append(f"resident memory grew from {rss100 >> 20} MiB after 100 requests to {end >> 20} MiB")
    t.extra = (f"resident {rss100 >> 20} MiB after 100, {end >> 20} MiB after {n} ({end / rss100 - 1:+.0%}); "
               f"answers {dict(sorted(codes.items()))}{engine}")
    return t


def held_connections(url: str, n: int = 300, wait: float | None = None) -> Tally:
    """`n` connections that send half a request's head and hold, and `n // 10` whose body stops
    short of its Content-Length: bad for each still open `wait` seconds later (the server's
    header and body deadlines, plus 2 s)."""
    import socket

    from railcall.server.protocol import BODY_TIMEOUT, HEADER_TIMEOUT

    host, port = url.removeprefix("http://").split(":")
    socks = []
    for i in range(n + n // 10):
        c = socket.create_connection((host, int(port)))
        if i < n:
            c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        else:
            c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n{\"model\": ")
        socks.append(c)
    time.sleep(wait if wait is not None else max(HEADER_TIMEOUT, BODY_TIMEOUT) + 2)
    t = Tally()
    for i, c in enumerate(socks):
        c.setblocking(False)
        try:
            data = c.recv(65536)
            open_ = False  # b"" (closed) or an answer (a 4xx) followed by the close
        except BlockingIOError:
            open_ = True
        except ConnectionResetError:
            open_ = False
        c.close()
        t.add(f"connection {i} ({'head' if i < n else 'body'}) still open" if open_ else None)
    return t


ATTACKS = {"links in .railcall/": state_links, "append_file killed": append_kills,
           "planted policies": policy_plants, "forged skills": skill_forgery,
           "policy re-link race": policy_race, "1,000-deep tree": deep_tree, "folder swap race": swap_race}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=int, default=1, help="attempts are this many times the test's")
    ap.add_argument("--only", default="", help="run the attacks whose name contains this")
    ap.add_argument("--engine-memory-mb", type=int, default=None,
                    help="the served engine's memory budget (railcall serve --engine-memory-mb; default its own)")
    ap.add_argument("--server", action="store_true",
                    help="also start the embedded model's server here and run the hostile-client attacks")
    a = ap.parse_args(argv)
    print("| attack | attempts | bad | note |\n|---|---|---|---|")
    bad = 0
    if a.server:
        from railcall.server.app import start_in_thread

        mb = a.engine_memory_mb
        run = start_in_thread(api_key=API_KEY, engine_bytes=mb << 20 if mb else None)
        vocab = run.app.state.served.vocab
        for name, attack in (("fresh schemas (server memory)", lambda: schema_soak(run.url, 100 * a.scale, vocab)),
                             ("held connections", lambda: held_connections(run.url, 30 * a.scale))):
            if a.only and a.only not in name:
                continue
            t0 = time.monotonic()
            r = attack()
            bad += len(r.bad)
            print(f"| {name} | {r.attempts:,} | {len(r.bad)} | {r.extra} ({time.monotonic() - t0:.0f} s) |", flush=True)
            for b in r.bad[:5]:
                print(f"  bad: {b}", file=sys.stderr)
        run.server.should_exit = True
    for name, attack in ATTACKS.items():
        if a.only and a.only not in name:
            continue
        t0 = time.monotonic()
        try:
            r = attack(a.scale)
        finally:
            cleanup()
        bad += len(r.bad)
        print(f"| {name} | {r.attempts:,} | {len(r.bad)} | {r.extra} ({time.monotonic() - t0:.0f} s) |", flush=True)
        for b in r.bad[:5]:
            print(f"  bad: {b}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.path.insert(0, SRC)
    raise SystemExit(main())
