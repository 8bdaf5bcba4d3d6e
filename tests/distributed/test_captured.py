"""Collectives captured in graphs (torch.neuron.graph) on 2 processes (jobs.py)."""
from . import launch


def test_collectives_replay_from_captured_graphs():
    """A tensor-parallel MLP, every single-tensor collective, a data-parallel training step and a compiled graph
    with a collective, each captured with the ops around it and replayed on new inputs: equal to the CPU; a
    capture over two process groups is refused."""
    launch.check(launch.run("captured", timeout=150))
