"""Run a job of jobs.py in 2 fresh processes (as torchrun would), under a hard timeout.

Each rank is a subprocess with torchrun's environment; a job passes when every
rank exits 0. Start-up (torch + jax import, joining the runtime) costs seconds,
so each job groups many checks.
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

JOBS = Path(__file__).with_name("jobs.py")
SRC = Path(__file__).resolve().parents[2] / "src"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(job: str, *args: str, world: int = 2, nodes: int = 1, timeout: float = 120, env=None, jobs: Path = JOBS):
    """Start `world` ranks of `job` (`nodes` nodes of world/nodes ranks each); returns [(returncode, output)]."""
    port, reinit_port = free_port(), free_port()
    per_node = world // nodes
    cache = tempfile.mkdtemp(prefix="torchneuron-dist-cache-")  # compiled graphs: this job's own
    procs = []
    for rank in range(world):
        rank_env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), REINIT_PORT=str(reinit_port), RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(rank % per_node), LOCAL_WORLD_SIZE=str(per_node),
            PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
            PYTHONUNBUFFERED="1", TORCHNEURON_FALLBACK="error", TORCHNEURON_CACHE_DIR=cache,
        )
        rank_env.update(env or {})
        procs.append(subprocess.Popen(
            [sys.executable, str(jobs), job, *args], env=rank_env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        ))
    results = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            out, _ = proc.communicate()
            out = f"TIMED OUT after {timeout}s\n{out}"
        results.append((proc.returncode, out))
    shutil.rmtree(cache, ignore_errors=True)
    return results


def check(results) -> None:
    failed = [f"--- rank {r} exited {code}:\n{out[-6000:]}" for r, (code, out) in enumerate(results) if code != 0]
    assert not failed, "\n".join(failed)
