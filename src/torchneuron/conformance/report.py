"""Sweeps over op_db and their summary: per check and dtype, how many ops pass, fail or fall back."""
import collections
import concurrent.futures
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import zlib

import torch

from . import harness

# every SUBSET_STRIDE-th op (by a stable hash of its id) forms the CI subset
SUBSET_STRIDE = 16
SUBSET_CHECKS = ("forward", "grad")
SUBSET_DTYPES = (torch.float32,)


def in_subset(op_id: str) -> bool:
    return zlib.crc32(op_id.encode()) % SUBSET_STRIDE == 0


def select_ops(ids=None, subset=False) -> list:
    ops = harness.all_ops()
    if ids is not None:
        known = {harness.op_id(op): op for op in ops}
        missing = [i for i in ids if i not in known]
        if missing:
            raise SystemExit(f"unknown op ids: {', '.join(missing)}")
        return [known[i] for i in ids]
    return [op for op in ops if not subset or in_subset(harness.op_id(op))]


def parse_dtypes(names):
    if not names:
        return harness.DTYPES
    return tuple(getattr(torch, name) for name in names.split(","))


def sweep(ops, checks, dtypes, path, progress=None, workers=None) -> list:
    """Check `ops` in child processes, `workers` at a time (default: one per core, at most 4), appending
    results to `path`: a check that kills its process (an abort inside XLA or the autograd engine) is
    recorded as a failure and the sweep goes on."""
    workers = max(1, min(workers or os.cpu_count() or 1, 4, len(ops)))
    shards = [f"{path}.{k}" for k in range(workers)]
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for finished in [pool.submit(_sweep_in_a_child, ops[k::workers], checks, dtypes, shards[k], progress)
                         for k in range(workers)]:
            finished.result()
    with open(path, "a") as sink:
        for shard in shards:
            with open(shard) as source:
                sink.write(source.read())
            os.remove(shard)
            os.remove(f"{shard}.done")
    wanted = {harness.op_id(op) for op in ops}
    return [r for r in load([path]) if r.op in wanted]


def _sweep_in_a_child(ops, checks, dtypes, path, progress) -> None:
    """Check `ops` in one child process at a time, restarting past an op that killed it."""
    remaining = [harness.op_id(op) for op in ops]
    by_id = {harness.op_id(op): op for op in ops}
    open(path, "a").close()
    done_path = f"{path}.done"
    open(done_path, "w").close()
    while remaining:
        command = [sys.executable, "-m", "torchneuron.conformance", "--in-process", "--ops", ",".join(remaining),
                   "--checks", ",".join(checks), "--dtypes", ",".join(map(harness.dtype_name, dtypes)),
                   "--results", path]
        code = subprocess.run(command, stderr=progress, stdout=subprocess.DEVNULL).returncode
        done = _done(done_path)
        remaining = [op for op in remaining if f"op:{op}" not in done]
        if remaining and code != 0:
            crashed = remaining[0]
            pending = [harness.key(crashed, c, d) for c, d in harness.planned(by_id[crashed], checks, dtypes)]
            pending = [k for k in pending if k not in done] or [harness.key(crashed, "crash", None)]
            op, check = pending[0].split(" ")
            check, dtype = check.split(":")
            result = harness.Result(op, check, dtype, harness.FAIL, f"process died (exit code {code})")
            _append(path, [result])
            _append(done_path, result.key)
            if check == "crash":  # it dies outside any check (at start-up, say): nothing left to try
                _append(done_path, f"op:{crashed}")


def _done(path) -> set:
    with open(path) as source:
        return {line.strip() for line in source}


def run_in_process(ops, checks, dtypes, path, progress) -> None:
    """Check ops here, skipping checks already done in this sweep (a child restarted after a crash)."""
    done_path = f"{path}.done"
    skip = _done(done_path) if os.path.exists(done_path) else set()
    for number, op in enumerate(ops, 1):
        start = time.perf_counter()
        failed = []
        for result in harness.iter_checks(op, checks, dtypes, skip):
            _append(path, [result])
            _append(done_path, result.key)
            failed += [result.key] if result.status != harness.PASS else []
        _append(done_path, f"op:{harness.op_id(op)}")
        print(f"[{number}/{len(ops)}] {harness.op_id(op)} {time.perf_counter() - start:.1f}s "
              f"{'failed: ' + ', '.join(failed) if failed else 'ok'}", file=progress, flush=True)


def _append(path, lines) -> None:
    with open(path, "a") as sink:
        if isinstance(lines, str):
            sink.write(lines + "\n")
        else:
            sink.writelines(json.dumps(dataclasses.asdict(r)) + "\n" for r in lines)


def load(paths) -> list:
    """Saved results; a later line for the same (op, check, dtype) replaces an earlier one."""
    latest = {}
    for path in paths:
        with open(path) as source:
            for line in source:
                if line.strip():
                    result = harness.Result(**json.loads(line))
                    latest[result.key] = result
    return list(latest.values())


def _row_name(result) -> str:
    return result.check if result.check != "forward" else f"forward {result.dtype}"


# the passes that matched only the CPU computed in float32 (low-precision forward), counted apart
FLOAT32 = "float32 reference"


def summarize(results) -> dict:
    """{row: {total, pass, fail, fallback, float32 reference}}, rows in a stable order: forward per dtype, then grad and variants."""
    rows = collections.defaultdict(collections.Counter)
    for result in results:
        row = rows[_row_name(result)]
        row["total"] += 1
        row[result.status] += 1
        row[FLOAT32] += result.message == harness.FLOAT32_REFERENCE
    order = [f"forward {harness.dtype_name(d)}" for d in harness.DTYPES] + list(harness.CHECKS[1:]) + ["timeout", "crash"]
    ops = len({r.op for r in results})
    return {"ops": ops, "rows": {name: dict(rows[name]) for name in order if name in rows}}


def _percent(row) -> str:
    return f"{100 * row.get(harness.PASS, 0) / row['total']:.1f}%" if row["total"] else "-"


def table(summary) -> str:
    header = ("check", "ops", "passing", "of which float32 ref.", "failing", "fallback", "pass rate")
    lines = [header] + [_cells(name, row) for name, row in summary["rows"].items()]
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    text = ["  ".join(str(v).ljust(w) for v, w in zip(line, widths)) for line in lines]
    return f"OpInfo conformance, {summary['ops']} op_db entries, CPU fallback disabled\n" + "\n".join(text)


def markdown(summary) -> str:
    lines = [
        f"OpInfo conformance: {summary['ops']} `op_db` entries run on `neuron` and on the CPU, CPU fallback "
        "disabled (a fallback counts as a failure).",
        "",
        "| check | ops | passing | of which float32 ref. | failing | fallback | pass rate |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += ["| " + " | ".join(map(str, _cells(name, row))) + " |" for name, row in summary["rows"].items()]
    return "\n".join(lines) + "\n"


def _cells(name, row) -> tuple:
    return (name, row["total"], row.get(harness.PASS, 0), row.get(FLOAT32, 0), row.get(harness.FAIL, 0),
            row.get(harness.FALLBACK, 0), _percent(row))


def write(summary, results, json_path, markdown_path) -> None:
    failures = sorted((r.key, r.message) for r in results if r.status != harness.PASS)
    with open(json_path, "w") as sink:
        json.dump(dict(summary, failures=dict(failures)), sink, indent=1)
    with open(markdown_path, "w") as sink:
        sink.write(markdown(summary))


def write_expected(results, path) -> None:
    """The failures as `<op> <check>:<dtype>  <reason>` lines, the reason shortened from the error."""
    lines = [f"{r.key}  {reason(r)}" for r in results if r.status != harness.PASS]
    with open(path, "w") as sink:
        sink.write("# <op> <check>:<dtype>  <one-line reason>; fix an op, then delete its line (the list only shrinks)\n")
        sink.writelines(line + "\n" for line in sorted(lines))


def reason(result) -> str:
    missing = re.search(r"(?:torchneuron: |no lowering for )(\S+?)\.? (?:has no neuron lowering|Please)", result.message)
    if missing:
        return f"{'fallback' if result.status == harness.FALLBACK else 'missing lowering'}: {missing.group(1)}"
    return " ".join(result.message.split())[:140]
