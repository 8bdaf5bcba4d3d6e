"""Run every benchmark and write a Markdown + JSON report.

    python -m bench.run                      # full suite on XLA:CPU, report in bench/results/
    python -m bench.run --smoke              # seconds-long run that only checks the suite works
    TORCHNEURON_PLATFORM=cuda python -m bench.run --gpu --out DIR   # on an NVIDIA GPU, vs PyTorch CUDA

Benchmarks are not tests: run them with nothing else busy on the machine.
"""
import argparse
import datetime
import json
import os
import pathlib
import platform
import sys

import jax
import torch

import torchneuron  # noqa: F401

from . import micro, models, throughput

SECTIONS = {"micro": micro, "models": models, "throughput": throughput}


def environment(device_label: str) -> dict:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "jax": jax.__version__,
        "neuron platform": torch.neuron.get_device_name(),
        "baseline device": device_label,
    }


def ratios(row: dict, ours: str, skip=()) -> dict:
    """Each other column divided by ours, within the row (same run): >1 means ours is slower for us/op."""
    value = row.get(ours)
    if not isinstance(value, (int, float)):
        return {}
    out = {}
    for column, other in row.items():
        if column in ("benchmark", "unit", ours, *skip) or not isinstance(other, (int, float)) or not other:
            continue
        out[f"{ours} / {column}"] = value / other
    return out


def markdown(report: dict) -> str:
    lines = [f"# TorchNeuron benchmarks ({report['environment']['date']})", ""]
    lines += [f"- {k}: {v}" for k, v in report["environment"].items()]
    for section, rows in report["sections"].items():
        columns = ["benchmark", "unit"] + sorted({c for r in rows for c in r if c not in ("benchmark", "unit")})
        lines += ["", f"## {section}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for row in rows:
            cells = [row.get(c, "") for c in columns]
            lines.append("| " + " | ".join(f"{c:.3g}" if isinstance(c, float) else str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes and repeats: checks the suite runs")
    parser.add_argument("--gpu", action="store_true", help="compare against PyTorch CUDA instead of the CPU")
    parser.add_argument("--only", choices=sorted(SECTIONS), action="append")
    parser.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    device = "neuron"
    report = {"environment": environment("cuda" if args.gpu else "cpu"), "smoke": args.smoke, "sections": {}}
    for name in args.only or SECTIONS:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        rows = SECTIONS[name].run(device, args.smoke, baseline="cuda" if args.gpu else "cpu")
        ours = [f"{device} adaptive", device] if name != "models" else [f"{device} adaptive", f"{device} eager"]
        for row in rows:
            measured = dict(row)
            row.update(ratios(measured, ours[1]))
            row.update(ratios(measured, ours[0], skip=[ours[1]]))
        report["sections"][name] = rows
        # written after each section, so that a run stopped at a time limit keeps what it measured
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(report, indent=2))
        (out / "report.md").write_text(markdown(report))
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
