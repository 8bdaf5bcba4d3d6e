"""Make the `torch_dynamo_backends` entry point of this checkout's pyproject.toml discoverable.

An editable install records entry points when it is installed; one made before
the entry point existed lacks it until `pip install -e .` runs again. Tests
then see the checkout's entry points through a generated dist-info directory.
"""
import importlib.metadata
import os
import tempfile
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GROUP = "torch_dynamo_backends"


def declared() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["entry-points"][GROUP]


def installed() -> bool:
    return "neuron" in {ep.name for ep in importlib.metadata.entry_points(group=GROUP)}


def metadata_dir() -> str | None:
    """A directory to put on sys.path when the installed metadata lacks the entry point, else None."""
    if installed():
        return None
    path = tempfile.mkdtemp(prefix="torchneuron-entry-points-")
    info = os.path.join(path, "torchneuron_checkout_entry_points-0.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: torchneuron-checkout-entry-points\nVersion: 0\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write(f"[{GROUP}]\n" + "".join(f"{k} = {v}\n" for k, v in declared().items()))
    return path
