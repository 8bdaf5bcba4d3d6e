"""The `neuron` c10d backend across 2 processes (each job in launch.py runs both ranks, 120 s at most)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from . import launch


def test_collectives_views_async_groups_functional_and_reinit():
    """Every collective and ReduceOp against CPU-computed results, strided views written in place,
    async Work and overlap, p2p, subgroups, object and functional collectives, device mesh, then a
    second init_process_group("cpu:gloo,neuron:neuron", device_id=...) in the same processes."""
    launch.check(launch.run("collectives"))


def test_ddp_matches_single_process_training():
    """20 steps of DDP on 2 ranks (several buckets; no_sync; fp16 and bf16 compression hooks;
    find_unused_parameters; static_graph; torch.compile of the DDP module, split at its buckets by Dynamo's
    DDP optimizer; ZeroRedundancyOptimizer; Join with uneven inputs; the post-localSGD hook with its default
    subgroup) give the losses and parameters of one process training on the full batch; so does a model whose
    batch norm is a SyncBatchNorm. Both ranks share a node, so rank 1 trains on neuron:1."""
    variants = "default,no_sync,fp16,bf16,find_unused,static_graph,compiled,zero,join,post_local_sgd,sync_batch_norm"
    launch.check(launch.run("ddp", variants, timeout=240))


@pytest.mark.parametrize("fault", ["raise", "die"])
def test_a_failing_rank_fails_the_others_instead_of_hanging(fault):
    results = launch.run("fault", fault, timeout=90)
    assert all("TIMED OUT" not in out for _, out in results), results
    assert all(code != 0 for code, _ in results), results
    # the surviving rank is stopped by the runtime's failure detection, not by the test's timeout
    survivor = results[0][1]
    assert re.search(r"DistBackendError|detected fatal errors|Gloo .* failed", survivor), survivor[-3000:]


def test_mismatched_shapes_raise_a_clear_error():
    results = launch.run("fault", "shape", timeout=90)
    assert all(code != 0 for code, _ in results), results
    assert any(re.search(r"ranks disagree on a collective: rank \d runs all_reduce", out) for _, out in results), results


def test_torchrun_two_nodes_on_one_host_trains_the_example():
    """torchrun's launch (static rendezvous, --nnodes 2): the example sets its device before
    init_process_group, so the runtime joins the others at that first device use, via the agent's store."""
    port = launch.free_port()
    example = Path(__file__).resolve().parents[2] / "examples" / "ddp_torchrun.py"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(launch.SRC), os.environ.get("PYTHONPATH", "")]))
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
             "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port), str(example)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for node in range(2)
    ]
    try:
        outputs = [node.communicate(timeout=120)[0] for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert all(node.returncode == 0 for node in nodes), outputs
    losses = [float(m) for m in re.findall(r"step +\d+ +loss ([\d.]+)", outputs[0])]
    assert len(losses) == 5 and losses[-1] < losses[0], outputs[0]
