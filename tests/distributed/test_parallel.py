"""PyTorch's parallelism APIs on `neuron` across 2 processes (parallel_jobs.py; each job runs both ranks
under a hard timeout), each compared with one process computing the same thing on the CPU."""
import re
from pathlib import Path

from . import launch

JOBS = Path(__file__).with_name("parallel_jobs.py")


def test_fsdp2_variants_match_single_process_training_and_free_unsharded_memory():
    """fully_shard with reshard_after_forward True/False/int, bf16 mixed precision, CPU offload, gradient
    clipping and gradient accumulation; unsharded parameters are freed after their layer's forward."""
    launch.check(launch.run("fsdp", timeout=240, jobs=JOBS))


def test_fsdp1_variants_match_single_process_training():
    """FullyShardedDataParallel (FSDP1) from a CPU model: full and gradient-and-optimizer sharding, original
    parameters, bf16 mixed precision, its gradient clipping, full parameters summoned to the CPU and offloaded
    full state dicts."""
    launch.check(launch.run("fsdp1", timeout=240, jobs=JOBS))


def test_dtensor_tensor_sequence_and_loss_parallel():
    """DTensor redistribution and ops, the RNG tracker, Colwise/Rowwise (eager and compiled), sequence
    parallel, loss parallel, and FSDP2 + TP on a 2-D mesh."""
    launch.check(launch.run("tensor_parallel", timeout=240, jobs=JOBS))


def test_pipelining_checkpoints_and_compiled_fsdp2(tmp_path):
    """GPipe and 1F1B schedules, a sharded checkpoint saved, reloaded and resumed, saved asynchronously, a full
    state dict broadcast from rank 0, compiled FSDP2; then the 2-rank checkpoint loads into one process."""
    path = str(tmp_path / "checkpoint")
    launch.check(launch.run("pipeline_checkpoint_compile", path, timeout=240, jobs=JOBS))
    launch.check(launch.run("checkpoint_on_one_rank", path, world=1, timeout=120, jobs=JOBS))


def test_p2p_matches_by_peer_tag_and_order_and_interleaved_1f1b_runs():
    """batch_isend_irecv with sends and receives in different orders on the two ranks, receives by tag
    out of order, a receive into a strided view, and ScheduleInterleaved1F1B (two stages per rank)
    against one process on the CPU."""
    launch.check(launch.run("p2p_order", timeout=120, jobs=JOBS))


def test_a_rank_dying_mid_fsdp2_step_fails_the_other_and_leaves_the_checkpoint_loadable(tmp_path):
    """Rank 1 exits between forward and backward of the third step: rank 0, in the backward's
    reduce-scatter, fails with the runtime's error well before the test's timeout; the checkpoint saved
    after the first step then loads into one process."""
    path = str(tmp_path / "checkpoint")
    results = launch.run("fsdp_rank_dies", path, timeout=150, jobs=JOBS)
    assert all("TIMED OUT" not in out for _, out in results), results
    assert [code for code, _ in results] != [0, 0] and results[1][0] == 3, results
    survivor = results[0][1]
    assert results[0][0] != 0, survivor[-3000:]
    assert re.search(r"DistBackendError|detected fatal errors|Gloo .* failed|heartbeat", survivor), survivor[-3000:]
    launch.check(launch.run("checkpoint_on_one_rank", path, world=1, timeout=120, jobs=JOBS))


def test_context_parallel_attention_matches_one_process():
    """context_parallel: causal attention (with the default head-tail load balancer, and without) and
    non-causal attention over a sequence split across the ranks, forward and q/k/v gradients unsharded
    by context_parallel_unshard, equal one CPU process; also compiled (all-to-all rotation)."""
    launch.check(launch.run("context_parallel", timeout=240, jobs=JOBS))
