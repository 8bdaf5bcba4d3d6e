"""`python -m torchneuron.conformance`: run the OpInfo sweep (or read saved results) and report.

    python -m torchneuron.conformance                       # full sweep (about 40 minutes on 2 cores)
    python -m torchneuron.conformance --shard 1/4 --results part1.jsonl
    python -m torchneuron.conformance --from part*.jsonl --json conformance.json --markdown conformance.md
"""
import argparse
import sys

from . import report


def _parse(argv):
    parser = argparse.ArgumentParser(prog="python -m torchneuron.conformance", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from", dest="sources", nargs="+", metavar="JSONL",
                        help="report saved results instead of running")
    parser.add_argument("--ops", help="comma-separated op ids (default: every op_db entry)")
    parser.add_argument("--subset", action="store_true", help="the sampled subset that CI runs")
    parser.add_argument("--shard", default="1/1", help="run shard I of N (I/N) of the ops")
    parser.add_argument("--checks", default=",".join(report.harness.CHECKS), help="comma-separated checks")
    parser.add_argument("--dtypes", help="comma-separated dtypes for forward (default: all tested)")
    parser.add_argument("--results", default="conformance.jsonl", help="where results are appended, one per line")
    parser.add_argument("--in-process", action="store_true",
                        help="run without child processes (a crashing op ends the run); no report")
    parser.add_argument("--write-expected", metavar="TXT",
                        help="write the failures as an expected-failures list (tests/conformance/expected_failures.txt)")
    parser.add_argument("--json", default="conformance.json", help="summary JSON to write")
    parser.add_argument("--markdown", default="conformance.md", help="Markdown table to write")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    options = _parse(argv)
    if options.sources:
        results = report.load(options.sources)
    else:
        index, count = (int(v) for v in options.shard.split("/"))
        ops = report.select_ops(options.ops.split(",") if options.ops else None, options.subset)[index - 1::count]
        dtypes = report.parse_dtypes(options.dtypes)
        checks = options.checks.split(",")
        if options.in_process:
            report.run_in_process(ops, checks, dtypes, options.results, progress=sys.stderr)
            return 0
        results = report.sweep(ops, checks, dtypes, options.results, progress=sys.stderr)
    summary = report.summarize(results)
    print(report.table(summary))
    report.write(summary, results, options.json, options.markdown)
    if options.write_expected:
        report.write_expected(results, options.write_expected)
    return 0


if __name__ == "__main__":
    sys.exit(main())
