"""What the backend adds to every `import torch`: it autoloads (torch.backends entry point), CPU-only scripts
included.

    python -m bench.import_time            # median of 7 fresh processes each way
    python -m bench.import_time --runs 3

Each process times its own `import torch`, with the backend autoloading and with
TORCH_DEVICE_BACKEND_AUTOLOAD=0 (PyTorch alone), interleaved. Run it on an otherwise idle machine.
"""
import argparse
import os
import statistics
import subprocess
import sys

_TIMED_IMPORT = "import time; start = time.perf_counter(); import torch; print(time.perf_counter() - start)"


def import_seconds(autoload: bool) -> float:
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="1" if autoload else "0")
    done = subprocess.run([sys.executable, "-c", _TIMED_IMPORT], env=env, capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args(argv)
    seconds = {True: [], False: []}
    for _ in range(args.runs):
        for autoload in seconds:
            seconds[autoload].append(import_seconds(autoload))
    with_backend, alone = statistics.median(seconds[True]), statistics.median(seconds[False])
    print(f"import torch: {alone:.2f} s alone, {with_backend:.2f} s with the backend "
          f"(+{with_backend - alone:.2f} s), median of {args.runs}")


if __name__ == "__main__":
    main()
