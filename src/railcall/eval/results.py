"""A run folder's files, read and written: `results.jsonl` (one record per task and condition),
`run.json` (the settings and machine), and the older runs kept beside them.

Below both the runner (which appends records) and the report (which summarises them): neither
imports the other for the format they share.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from railcall.atomic import mend_last_line

# The grammar; the free reply at its best in railcall's own prompt; the free reply in BFCL's own
# prompt-mode format (a Python list of calls), read by BFCL's own decoder (runner.py).
CONDITIONS = ("with_grammar", "without_grammar", "bfcl_prompt")


# What `report.summarise` and a resumed run read from every record, with its JSON type.
RECORD_FIELDS = {"category": str, "id": str, "condition": str, "parse": bool, "valid": bool, "ast": bool,
                 "tokens": int, "seconds": (int, float), "cut": bool}
_KIND = {str: "a string", bool: "true or false", int: "a whole number", (int, float): "a number"}


def fields_problem(r, fields: dict) -> str:
    """"" when `r` is a JSON object holding every one of `fields` with a value of its type, else
    what is wrong with it: the fields missing, or the first one of the wrong type. Every suite's
    records are checked by it (`fields`: that suite's RECORD_FIELDS)."""
    if not isinstance(r, dict):
        return f"not a JSON object but {type(r).__name__}"
    missing = [k for k in fields if k not in r]
    if missing:
        return f"no {', '.join(repr(k) for k in missing)}"
    for k, kind in fields.items():
        if not isinstance(r[k], kind) or (isinstance(r[k], bool) and kind is not bool):  # True is an int too
            return f"{k!r} is {json.dumps(r[k])[:40]}, not {_KIND[kind]}"
    return ""


def record_problem(r) -> str:
    """"" when `r` is a results record the summary can use, else what is wrong with it."""
    problem = fields_problem(r, RECORD_FIELDS)
    if problem:
        return problem
    if r["condition"] not in CONDITIONS:
        return f"condition {r['condition']!r} is not one of {', '.join(CONDITIONS)}"
    return ""


def read_results(path: Path, *, repair: bool = False, warn: Callable[[str], None] | None = None,
                 check: Callable[[object], str] = record_problem) -> list[dict]:
    """The records in a results file, each line checked (`record_problem`).

    A line is whole only with its newline. A last line without one is an interrupted write: when
    it parses it is the whole record and is kept, when not it is left out. With `repair=True`
    (only the run that owns the file: it appends next) the file is made to end on a newline --
    the missing newline written, or the torn part cut off -- so the next append starts a line
    of its own instead of joining the torn one (which would lose both records). Any other line
    that does not parse or is not a usable record is skipped, and `warn` is told which and why;
    the file keeps it. `check` says what is wrong with a record ("" if nothing)."""
    warn = warn or (lambda m: None)
    if not path.is_file():
        return []
    data = path.read_bytes()
    records = []
    lines = data.split(b"\n")
    for k, line in enumerate(lines):
        torn = k == len(lines) - 1 and line != b""  # what follows the final newline, if anything
        where = f"{path} line {k + 1}"
        try:
            r = json.loads(line) if line.strip() else None
        except ValueError as e:
            if torn:
                warn(f"{where}: an interrupted write (no newline, does not parse); "
                     + ("cut off, its task is decoded again" if repair else "left out"))
                if repair:
                    mend_last_line(path)
                break
            warn(f"{where}: does not parse ({e}); skipped")
            r = None
        else:
            if torn and repair:
                mend_last_line(path)  # the record is whole; only its newline was lost
            if r is not None:
                problem = check(r)
                if problem:
                    warn(f"{where}: not a results record ({problem}); skipped")
                else:
                    records.append(r)
    return records


def read_run(path: Path) -> dict:
    """A run folder's run.json ({"settings": {...}, "machine": {...}, "machines": [...]}: the
    last machine that wrote records and all that did), or ValueError saying
    what is wrong with it."""
    try:
        run = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {e}; fix it, or use another --out") from None
    if not isinstance(run, dict) or not isinstance(run.get("settings"), dict):
        raise ValueError(f'{path} holds no "settings" object; fix it, or use another --out')
    return run


def set_aside(out: Path) -> Path | None:
    """Keep a previous run's results.jsonl and run.json before a fresh run in `out`: they become
    results.jsonl.old.N and run.json.old.N, N one more than any before, so no earlier run is
    ever replaced (results.jsonl.old, from older railcall, is left as it is). An empty results
    file holds nothing to keep and is removed. Returns where the results went (None: nowhere)."""
    results = out / "results.jsonl"
    if results.stat().st_size == 0:
        results.unlink()
        return None
    used = [int(p.name.rsplit(".", 1)[1]) for name in ("results.jsonl", "run.json")
            for p in out.glob(f"{name}.old.*") if p.name.rsplit(".", 1)[1].isdigit()]
    n = max(used, default=0) + 1
    if (out / "run.json").is_file():
        os.replace(out / "run.json", out / f"run.json.old.{n}")
    kept = out / f"results.jsonl.old.{n}"
    os.replace(results, kept)
    return kept


def start(out: Path, *, resume: bool, key: Callable[[dict], object], check: Callable[[object], str] = record_problem,
          log: Callable[[str], None] | None = None) -> tuple[Path, set]:
    """Open a run in `out` for appending: its results.jsonl and the keys (`key(record)`) of the
    records it already holds, which a resumed run skips. Without `resume`, an earlier results
    file is set aside first (`set_aside`) and nothing is skipped; with it, a torn last line is
    mended (`read_results(repair=True)`) so the next append starts a line of its own."""
    log = log or (lambda m: None)
    results_path = out / "results.jsonl"
    if not resume and results_path.exists():
        kept = set_aside(out)
        log(f"started afresh; the previous results are in {kept}" if kept else
            "started afresh (the previous results file was empty)")
    done = {key(r) for r in read_results(results_path, repair=True, warn=log, check=check)}
    return results_path, done


def append_records(f, records: list[dict]) -> None:
    # one write of whole lines per task, flushed and synced: a kill leaves at most a torn last line,
    # which the next run's read_results(repair=True) mends before it appends
    f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    f.flush()
    os.fsync(f.fileno())
