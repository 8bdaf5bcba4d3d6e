"""Collectives captured in graphs (torch.neuron.graph) on 2 processes (jobs.py)."""
from . import launch


def test_collectives_replay_from_captured_graphs():
    """A tensor-parallel MLP (by hand and by DTensor's parallelize_module, forward and training), every recorded
    collective, data-parallel training steps (all_reduce, DDP, FSDP2) and compiled graphs with a collective, with
    random ops and device-side checks, each captured with the ops around it and replayed on new inputs: equal
    to the CPU; a capture over two process groups is refused."""
    launch.check(launch.run("captured", timeout=150))
