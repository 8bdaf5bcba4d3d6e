"""Functional collectives inside torch.compile(backend="neuron") graphs, on 2 processes (jobs.py)."""
from . import launch


def test_functional_collectives_compile_into_one_program():
    """all_reduce + compute + all_gather (+ reduce_scatter, all_to_all_single, broadcast, integer
    reductions) in one graph equal eager and the CPU, and compile as one program with no split; under
    adaptive eager a collective is a sync point between queued ops."""
    launch.check(launch.run("compiled", timeout=150))
