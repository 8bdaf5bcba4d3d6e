"""The benchmark suite on an NVIDIA GPU: neuron on XLA:GPU (CUDA PJRT plugin) vs PyTorch CUDA.

    python -m bench.gpu --out DIR          # on a machine with an NVIDIA GPU (under 8 minutes on an H200)
    python -m bench.gpu --out DIR --cpu    # the same script on XLA:CPU vs PyTorch CPU, to keep it working

The platform is chosen before torch/jax are imported, so this module sets it and then runs bench.run.
"""
import argparse
import os
import sys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for report.md and report.json")
    parser.add_argument("--cpu", action="store_true", help="run on XLA:CPU against PyTorch CPU")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    os.environ["TORCHNEURON_PLATFORM"] = "cpu" if args.cpu else "cuda"
    from . import run

    argv = ["--out", args.out] + ([] if args.cpu else ["--gpu"]) + (["--smoke"] if args.smoke else [])
    # the model steps first: a run stopped at its time limit keeps the table that matters most
    argv += ["--only", "models", "--only", "micro", "--only", "throughput"]
    run.main(argv)


if __name__ == "__main__":
    sys.exit(main())
