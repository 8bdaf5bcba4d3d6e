"""PyTorch's device-generic test suites (test_shape_ops.py, test_indexing.py, ...) on the CPU and on neuron.

    python -m torchneuron.conformance.suites DIR                      # every test_*.py in DIR
    python -m torchneuron.conformance.suites DIR --suites test_indexing.py -k "not large_tensor"
    python -m torchneuron.conformance.suites --from results/*.jsonl rerun/*.jsonl   # later outcomes win

The suite files are not in the torch wheel: copy them from PyTorch's `test/` folder (a version whose imports
work with the installed torch). Each suite instantiates its tests for the CPU and for PrivateUse1 (`neuron`)
by itself; one pytest run executes both. The figure reported is the share of the tests that pass on the CPU
that also pass on neuron, among those neuron runs (a test neuron skips, `@onlyCPU` say, is left out and
counted apart). Failures are grouped by their exception's first line.

Each suite runs in child pytest processes with this module as a plugin: every test's outcome is appended to
a JSON-lines file as it ends, so a test that kills its process or runs past --test-timeout is recorded as a
failure and the run resumes after it.
"""
import argparse
import collections
import json
import os
import pathlib
import re
import subprocess
import sys
import threading

DEVICES = ("cpu", "neuron")
CRASHED = "crashed"
TIMED_OUT = 86  # the exit code of a child whose test ran out of time
_RESULTS_ENV = "TORCHNEURON_SUITE_RESULTS"
_TIMEOUT_ENV = "TORCHNEURON_SUITE_TEST_TIMEOUT"


# ---- the pytest plugin, loaded in the child (-p torchneuron.conformance.suites)

def _append(path, record) -> None:
    with open(path, "a") as sink:
        sink.write(json.dumps(record) + "\n")


def _records(path) -> list:
    if not os.path.exists(path):
        return []
    with open(path) as source:
        return [json.loads(line) for line in source if line.strip()]


def pytest_collection_modifyitems(config, items):
    path = os.environ.get(_RESULTS_ENV)
    if path:
        done = {r["nodeid"] for r in _records(path) if "outcome" in r}
        items[:] = [item for item in items if item.nodeid not in done]


def pytest_runtest_logstart(nodeid, location):
    path = os.environ.get(_RESULTS_ENV)
    if path:
        _append(path, {"nodeid": nodeid, "started": True})


def _kill_after(seconds, path, nodeid):
    def expire():
        _append(path, {"nodeid": nodeid, "outcome": CRASHED, "message": f"timed out after {seconds:.0f}s"})
        os._exit(TIMED_OUT)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    return timer


def pytest_runtest_protocol(item, nextitem):
    path, seconds = os.environ.get(_RESULTS_ENV), float(os.environ.get(_TIMEOUT_ENV, "0"))
    item._suite_timer = _kill_after(seconds, path, item.nodeid) if path and seconds else None


def pytest_runtest_logreport(report):
    path = os.environ.get(_RESULTS_ENV)
    if not path:
        return
    outcome = _outcome(report)
    if outcome is None:
        return
    message = _message(report) if outcome == "failed" else getattr(report, "wasxfail", "") or _skip_reason(report)
    _append(path, {"nodeid": report.nodeid, "outcome": outcome, "message": message})


def pytest_runtest_teardown(item, nextitem):
    timer = getattr(item, "_suite_timer", None)
    if timer is not None:
        timer.cancel()


def _outcome(report):
    """One outcome per test: the call's, or setup's when setup did not pass (a skip decided before the call)."""
    if hasattr(report, "wasxfail"):
        return "xpassed" if report.passed else "xfailed"
    if report.when == "call" or (report.when == "setup" and not report.passed):
        return report.outcome
    if report.when == "teardown" and report.failed:
        return "failed"
    return None


def _message(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    return crash.message if crash is not None else str(report.longrepr)[-2000:]


def _skip_reason(report) -> str:
    return report.longrepr[2] if isinstance(report.longrepr, tuple) else ""


# ---- running a suite (parent process)

def run_suite(path, results, pytest_args=(), test_timeout=600.0, progress=None) -> list:
    """Run one suite file until every collected test has an outcome; its records, this run's only."""
    env = dict(os.environ, **{_RESULTS_ENV: str(results), _TIMEOUT_ENV: str(test_timeout)})
    env.setdefault("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path.parent), env["PYTHONPATH"]]))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "torchneuron.conformance.suites",
               "-p", "no:logging", "--show-capture=no", str(path), *pytest_args]
    while True:
        code = subprocess.run(command, env=env, cwd=path.parent, stdout=progress, stderr=subprocess.STDOUT).returncode
        unfinished = _unfinished(_records(results))
        if unfinished:
            _append(results, {"nodeid": unfinished, "outcome": CRASHED, "message": f"process died (exit code {code})"})
        # a test killed its process (a signal, an abort) or ran out of time: go on after it
        if not (code < 0 or code == TIMED_OUT or unfinished):
            return _records(results)


def _unfinished(records):
    """The test that was running when the process ended, if it has no outcome."""
    started = [r["nodeid"] for r in records if r.get("started")]
    finished = {r["nodeid"] for r in records if "outcome" in r}
    return next((nodeid for nodeid in reversed(started) if nodeid not in finished), None)


# ---- comparing the devices

def test_key(nodeid):
    """(generic test id, device) from a node id such as `f.py::TestFooCPU::test_bar_cpu_float32`."""
    file, cls, name = (nodeid.split("::") + ["", ""])[:3]
    # a file's first instantiation names PrivateUse1 classes ...PRIVATEUSE1, later ones by the backend's name
    suffix = re.search(r"(CPU|PRIVATEUSE1|NEURON)$", cls)
    if suffix is None:
        return None, None
    device = "cpu" if suffix.group() == "CPU" else "neuron"
    generic_cls = cls[: suffix.start()]
    token = device
    generic_name = re.sub(rf"_{token}(?=(_|$))(?!.*_{token}(_|$))", "", name)
    return f"{file}::{generic_cls}::{generic_name}", device


PASSING = {"passed", "xfailed"}


def compare(records) -> dict:
    """Per suite: CPU-passing tests, how neuron fared on them, and neuron's failures grouped by cause."""
    outcomes = collections.defaultdict(dict)
    messages = {}
    for record in records:
        if "outcome" not in record:
            continue
        key, device = test_key(record["nodeid"])
        if key is not None:
            outcomes[key][device] = record["outcome"]
            messages[(key, device)] = record.get("message", "")
    cpu_passing = [k for k, o in outcomes.items() if o.get("cpu") in PASSING]
    skipped = sorted(k for k in cpu_passing if outcomes[k].get("neuron") == "skipped")
    not_run = sorted(k for k in cpu_passing if "neuron" not in outcomes[k])  # the run was cut short
    counted = [k for k in cpu_passing if k not in skipped and k not in not_run]
    failing = sorted(k for k in counted if outcomes[k]["neuron"] not in PASSING)
    causes = collections.defaultdict(list)
    for key in failing:
        causes[cause(messages[(key, "neuron")])].append(key)
    return {"cpu_passing": len(cpu_passing), "counted": len(counted), "neuron_passing": len(counted) - len(failing),
            "skipped_on_neuron": skipped, "not_run_on_neuron": not_run, "causes": dict(sorted(causes.items(), key=lambda c: -len(c[1])))}


def cause(message) -> str:
    """A failure's first line with its numbers, tensors and quoted names blurred, so alike failures group."""
    line = next((line for line in message.splitlines() if line.strip()), "").strip()
    line = re.sub(r"tensor\(.*", "tensor(...)", line)
    line = re.sub(r"0x[0-9a-f]+", "0x?", line)
    line = re.sub(r"\d+(\.\d+)?", "N", line)
    return line[:160]


def share(summary) -> str:
    return f"{100 * summary['neuron_passing'] / summary['counted']:.1f}%" if summary["counted"] else "-"


def report(name, summary, examples=3) -> str:
    lines = [f"{name}: {summary['neuron_passing']}/{summary['counted']} CPU-passing tests pass on neuron "
             f"({share(summary)}); of the {summary['cpu_passing']} passing on the CPU, "
             f"{len(summary['skipped_on_neuron'])} skip on neuron"
             + (f", {len(summary['not_run_on_neuron'])} were not run on neuron" if summary["not_run_on_neuron"] else "")]
    for reason, keys in summary["causes"].items():
        names = ", ".join(k.split("::")[-1] for k in keys[:examples]) + (", ..." if len(keys) > examples else "")
        lines.append(f"  {len(keys):4d}  {reason}\n        {names}")
    return "\n".join(lines)


def _parse(argv):
    parser = argparse.ArgumentParser(prog="python -m torchneuron.conformance.suites", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", nargs="?", type=pathlib.Path, help="folder holding the suite files")
    parser.add_argument("--suites", help="comma-separated file names (default: every test_*.py in DIRECTORY)")
    parser.add_argument("--results", type=pathlib.Path, default=pathlib.Path("suite_results"),
                        help="folder for each suite's JSON-lines results and pytest log")
    parser.add_argument("--from", dest="sources", nargs="+", type=pathlib.Path, metavar="JSONL",
                        help="report saved results instead of running")
    parser.add_argument("--resume", action="store_true", help="keep the tests already in the results, run the rest")
    parser.add_argument("--test-timeout", type=float, default=600.0, help="seconds one test may run")
    parser.add_argument("--all-causes", action="store_true", help="list every failing test, not a few per cause")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression (deselect tests too big for the machine)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    options = _parse(argv)
    examples = 10**6 if options.all_causes else 3
    if options.sources:
        # files of one suite (a rerun of some of its tests, say) are read in order: a later outcome wins
        by_suite = collections.defaultdict(list)
        for source in options.sources:
            by_suite[source.name.removesuffix(".jsonl")] += _records(source)
        for name, records in by_suite.items():
            print(report(name, compare(records), examples))
        return 0
    if options.directory is None:
        raise SystemExit("give the folder holding the suite files, or --from saved results")
    names = options.suites.split(",") if options.suites else sorted(p.name for p in options.directory.glob("test_*.py"))
    options.results.mkdir(parents=True, exist_ok=True)
    pytest_args = ["-k", options.keyword] if options.keyword else []
    for name in names:
        results = options.results / f"{name}.jsonl"
        if not options.resume:
            results.unlink(missing_ok=True)
        with open(options.results / f"{name}.log", "a" if options.resume else "w") as log:
            records = run_suite(options.directory.resolve() / name, results.resolve(), pytest_args,
                                options.test_timeout, progress=log)
        print(report(name, compare(records), examples), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
