"""The benchmark suite keeps working: its smoke mode runs every section and writes both reports."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import host_overhead
from bench.fixed_cost import CAPTURED, OPS
from bench.gpt_step import PRODUCTS
from bench.host_runs import fallback_cases
from bench.ops import cases

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
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| ") and not line.startswith("| op |")]
    assert [r[1].strip() for r in rows] == list(OPS) and all(len(r) == 11 for r in rows), out
    # the graph column: a replay time for each op a graph replays as it is, n/a for the one taking new numbers
    assert [r[1].strip() for r in rows if r[4].strip() != "n/a"] == list(CAPTURED), out
    assert all(float(r[4]) > 0 for r in rows if r[1].strip() in CAPTURED), out


def test_host_runs_bench_times_each_op_on_the_host_on_neuron_and_on_the_cpu():
    out = subprocess.run([sys.executable, "-m", "bench.host_runs", "--calls", "3", "--repeats", "1"], cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| ") and not line.startswith("| op |")]
    names = [f"fallback: {name}" for name in fallback_cases("cpu")] + ["host bookkeeping: growing int64 cat"]
    assert [r[1].strip() for r in rows] == names, out
    assert all(float(cell) > 0 for r in rows for cell in r[2:5]), out


def test_optimizer_step_bench_reports_both_implementations():
    out = subprocess.run([sys.executable, "-m", "bench.optimizer_step", "--parameters", "3", "--calls", "2",
                          "--repeats", "1"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| ") and not line.startswith("| AdamW")]
    assert [r[1].strip() for r in rows] == ["foreach", "fused"] and all(float(r[2]) > 0 for r in rows), out


def test_threads_bench_runs_each_thread_count_on_both_devices():
    out = subprocess.run([sys.executable, "-m", "bench.threads", "--steps", "3"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    rows = json.loads(out.splitlines()[-1])
    assert [(r["device"], r["threads"]) for r in rows] == [
        (device, threads) for device in ("neuron", "cpu") for threads in ("1 (both loops)", 2)], out
    assert all(r["seconds"] > 0 for r in rows) and all(r["ops_fused"] > 0 for r in rows[:2]), out


@pytest.mark.slow
def test_dispatch_floor_times_both_dispatch_designs():
    """The plain-tensor row comes from a process of its own, on a tensor its extension builds (compiled once)."""
    out = subprocess.run([sys.executable, "-m", "bench.dispatch_floor", "--calls", "5", "--repeats", "1"], cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout
    rows = {r[1].strip(): float(r[2]) for r in (line.split("|") for line in out.splitlines())
            if len(r) == 5 and r[2].strip().replace(".", "").isdigit()}
    assert set(rows) == {"neuron tensor, no-op dispatch", "plain tensor, Python fallback kernel", "bare jax.jit",
                         "neuron eager", "neuron adaptive eager", "torch cpu"}, out
    assert all(us > 0 for us in rows.values()), out


@pytest.mark.slow
def test_generate_bench_times_both_caches_cold_warm_and_on_the_cpu():
    out = subprocess.run([sys.executable, "-m", "bench.generate", "--tokens", "2"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| neuron") or line.startswith("| cpu")]
    assert [r[1].strip() for r in rows] == [f"{device}, {cache} cache{start}" for cache in ("dynamic", "static")
                                            for device, start in (("neuron", ", cold"), ("neuron", ", warm"),
                                                                  ("cpu", ""))], out
    assert all(float(r[2]) > 0 for r in rows), out


def test_gpt_products_bench_times_every_product_on_both_sides():
    out = subprocess.run([sys.executable, "-m", "bench.gpt_step", "--products"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    rows = [line.strip("| ").split(" | ") for line in out.splitlines() if line.startswith("| ") and "ms" not in line
            and not line.startswith("|---")]
    assert [r[0] for r in rows] == [name for name, *_ in PRODUCTS], out
    assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows), out


def test_ops_bench_smoke_times_every_op_on_both_sides():
    out = subprocess.run([sys.executable, "-m", "bench.ops", "--smoke"], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout
    rows = [line.strip("| ").split(" | ") for line in out.splitlines() if line.startswith("| ") and "ms |" not in line
            and not line.startswith("|---")]
    assert [r[0] for r in rows] == list(cases(2, 4, 8)), out
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows), out

@pytest.mark.slow
def test_attention_bench_smoke_runs_every_variant(tmp_path):
    out = tmp_path / "attention.json"
    subprocess.run([sys.executable, "-m", "bench.attention", "--smoke", "--json", str(out)], cwd=ROOT, check=True,
                   capture_output=True)
    rows = json.loads(out.read_text())["rows"]
    assert {(r["mode"], r["path"]) for r in rows} == {(m, p) for m in ("eager", "compiled") for p in ("fused", "math")}
    assert all(r["forward_ms"] > 0 and r["forward_backward_ms"] > 0 for r in rows)


def test_profiler_overhead_bench_reports_every_row():
    out = subprocess.run([sys.executable, "-m", "bench.profiler_overhead", "--calls", "200", "--repeats", "3"],
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout
    cells = [line.strip("| ").split(" | ") for line in out.splitlines() if line.startswith(("| a + b", "| hook"))]
    rows = {name: float(us) for name, us in cells}
    assert len(rows) == 4 and all(us > 0 for name, us in rows.items() if name.startswith("a + b")), out
    assert "hook checks per op (nothing listening)" in rows, out


def test_import_time_bench_times_both_imports():
    out = subprocess.run([sys.executable, "-m", "bench.import_time", "--runs", "1"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    alone, with_backend = map(float, re.search(r"([\d.]+) s alone, ([\d.]+) s with the backend", out).groups())
    assert 0 < alone < with_backend, out


@pytest.mark.slow
def test_host_overhead_bench_reports_every_mode():
    out = subprocess.run([sys.executable, "-m", "bench.host_overhead", "--smoke"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ") and "%" in line]
    assert [r[0].strip("| ") for r in rows] == list(host_overhead.MODES), out
    assert all(0 <= float(r[3].strip(" |%")) <= 100 and float(r[4].strip(" |")) > 0 for r in rows), out


@pytest.mark.slow
def test_kernels_bench_smoke_runs_the_pallas_lowering_interpreted(tmp_path):
    out = tmp_path / "kernels.json"
    subprocess.run([sys.executable, "-m", "bench.kernels", "--smoke", "--lowering", "pallas", "--case",
                    "adamw over 8 tensors", "--case", "rms_norm", "--out", str(out)], cwd=ROOT, check=True,
                   capture_output=True)
    rows = {r["case"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["adamw over 8 tensors"]["lowering"] == "pallas"
    # the norm's backward sums columns with a [1, 128] matmul, under Triton's 16
    assert rows["rms_norm"]["lowering"] == "auto" and "a matmul of (1, 128)" in rows["rms_norm"]["fallback"]
    assert all(r["kernel ms"] > 0 and r["eager ms"] > 0 for r in rows.values())


def test_compile_startup_bench_smoke_starts_cold_warm_and_precompiled():
    """bench/compile_step.py --startup in fresh processes: a warm start compiles nothing, and the precompiled one
    (fullgraph, over nn.TransformerEncoder) traces nothing, with the cold start's loss."""
    out = subprocess.run([sys.executable, "bench/compile_step.py", "--startup", "--smoke"], cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=600).stdout
    results = json.loads(out.strip().splitlines()[-1])
    cold, warm = results["cold cache"], results["warm cache"]
    precompiled_cold, precompiled_warm = results["precompiled, cold cache"], results["precompiled, warm cache"]
    assert cold["xla_compiles"] > 0 and warm["xla_compiles"] == 0 and warm["disk_cache_hits"] == cold["xla_compiles"]
    assert precompiled_warm["dynamo_graphs"] == 0 and precompiled_warm["xla_compiles"] == 0
    assert len({run["loss"] for run in (cold, warm, precompiled_cold, precompiled_warm)}) == 1
