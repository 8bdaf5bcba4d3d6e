"""PyTorch's parallelism APIs on `neuron` across 2 processes (parallel_jobs.py; each job runs both ranks
under a hard timeout), each compared with one process computing the same thing on the CPU."""
from pathlib import Path

from . import launch

JOBS = Path(__file__).with_name("parallel_jobs.py")


def test_fsdp2_variants_match_single_process_training_and_free_unsharded_memory():
    """fully_shard with reshard_after_forward True/False/int, bf16 mixed precision, CPU offload, gradient
    clipping and gradient accumulation; unsharded parameters are freed after their layer's forward."""
    launch.check(launch.run("fsdp", timeout=240, jobs=JOBS))


def test_dtensor_tensor_sequence_and_loss_parallel():
    """DTensor redistribution and ops, the RNG tracker, Colwise/Rowwise (eager and compiled), sequence
    parallel, loss parallel, and FSDP2 + TP on a 2-D mesh."""
    launch.check(launch.run("tensor_parallel", timeout=240, jobs=JOBS))


def test_pipelining_checkpoints_and_compiled_fsdp2(tmp_path):
    """GPipe and 1F1B schedules, a sharded checkpoint saved, reloaded and resumed, compiled FSDP2; then
    the 2-rank checkpoint loads into one process."""
    path = str(tmp_path / "checkpoint")
    launch.check(launch.run("pipeline_checkpoint_compile", path, timeout=240, jobs=JOBS))
    launch.check(launch.run("checkpoint_on_one_rank", path, world=1, timeout=120, jobs=JOBS))


def test_p2p_matches_by_peer_tag_and_order_and_interleaved_1f1b_runs():
    """batch_isend_irecv with sends and receives in different orders on the two ranks, receives by tag
    out of order, a receive into a strided view, and ScheduleInterleaved1F1B (two stages per rank)
    against one process on the CPU."""
    launch.check(launch.run("p2p_order", timeout=120, jobs=JOBS))
