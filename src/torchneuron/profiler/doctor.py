"""python -m torchneuron.doctor [--strict] [--html report.html] script.py [args...]

Runs a script as `python script.py args...` would, with the doctor listening, then prints what a person
reads in a minute: CPU fallbacks with their call sites, recompilations and their causes, graph breaks,
the slowest ops and programs, compilations, transfers, the memory peak and the largest live tensors.
--strict exits 1 when any op fell back to the CPU or an op or graph recompiled more than
--recompile-limit times after the warm-up (a training loop's first 2 optimizer steps; without steps,
the whole run), or Dynamo recompiled more than that in all (for CI); --html writes a self-contained
page with plots (needs matplotlib).
"""
import argparse
import os
import runpy
import sys

from . import report
from .collector import Collector


def run_script(script: str, args) -> tuple:
    """Run the script under a Collector; its exit status (SystemExit's code, or 0) and the Collector."""
    argv, path = sys.argv, list(sys.path)
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    status = 0
    try:
        with Collector() as collector:
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as exit_:
                status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        sys.argv, sys.path[:] = argv, path
    return status, collector


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchneuron.doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--strict", action="store_true", help="exit 1 on any CPU fallback or recompile storm")
    parser.add_argument("--recompile-limit", type=int, default=8,
                        help="recompilations of one op or graph after the warm-up (or Dynamo's, in all) that make "
                             "a storm (8)")
    parser.add_argument("--html", metavar="PATH", help="also write a self-contained HTML report with plots")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    status, collector = run_script(options.script, options.args)
    summary = report.summarize(collector, options.recompile_limit)
    sys.stdout.write(report.text(summary, options.script))
    if options.html:
        with open(options.html, "w") as f:
            f.write(report.page(summary, options.script))
        print(f"HTML report: {options.html}")
    if status:
        return status
    if options.strict and (summary["fallbacks"] or summary["storms"]):
        print("doctor --strict: failing on " + " and ".join(
            what for what, found in (("CPU fallbacks", summary["fallbacks"]), ("a recompile storm", summary["storms"]))
            if found))
        return 1
    return 0
