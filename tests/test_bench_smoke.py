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
