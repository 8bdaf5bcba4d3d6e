"""The benchmark suite keeps working: its smoke mode runs every section and writes both reports."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_smoke_writes_reports(tmp_path):
    subprocess.run([sys.executable, "-m", "bench.run", "--smoke", "--out", str(tmp_path)], cwd=ROOT, check=True,
                   capture_output=True)
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report["sections"]) == {"micro", "models", "throughput"}
    add = next(r for r in report["sections"]["micro"] if r["benchmark"] == "add 16x16")
    assert add["neuron"] > 0 and add["torch cpu"] > 0 and "neuron / torch cpu" in add
    assert add["neuron adaptive"] > 0 and "neuron adaptive / bare jax.jit" in add
    gpt = next(r for r in report["sections"]["models"] if r["benchmark"] == "gpt train step")
    assert gpt["neuron adaptive"] > 0 and gpt["neuron eager"] > 0
    assert "| add 16x16 |" in (tmp_path / "report.md").read_text()


def test_fixed_cost_prints_every_op():
    out = subprocess.run([sys.executable, "-m", "bench.fixed_cost", "--calls", "5", "--repeats", "1"], cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ") and ("16x16" in line or "add_" in line)]
    assert len(rows) == 3 and all(len(r.split("|")) == 9 for r in rows), out


def test_profiler_hooks_cost_within_budget_when_nothing_listens():
    out = subprocess.run([sys.executable, "-m", "bench.profiler_overhead", "--calls", "200", "--repeats", "3"],
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout
    cells = [line.strip("| ").split(" | ") for line in out.splitlines() if line.startswith(("| a + b", "| hook"))]
    rows = {name: float(us) for name, us in cells}
    assert len(rows) == 4 and all(us > 0 for name, us in rows.items() if name.startswith("a + b")), out
    assert rows["hook checks per op (nothing listening)"] <= 0.3, out
    assert "within the 0.3 us budget" in out
