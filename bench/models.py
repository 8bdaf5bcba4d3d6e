"""Training and inference steps of small models: neuron eager / compiled vs PyTorch CPU eager / Inductor."""
import sys

import torch
import torch.nn.functional as F
from torch import nn

from examples.demo import TinyGPT

from .timing import measure


def mlp():
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    return model, (torch.randn(64, 512), torch.randint(0, 10, (64,))), 64


def cnn():
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(64, 10),
    )
    return model, (torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))), 32


def gpt(smoke=False, negligible=False):
    """The small GPT; `negligible`: its layers (every op and tensor of a step) at sizes whose compute is
    negligible, so that a step's time is the host's work."""
    vocab, batch, context = (16, 1, 4) if negligible else (512, 8, 128)
    width, layers = (64, 2) if smoke else (256, 4)
    width = 8 if negligible else width
    model = TinyGPT(vocab, width=width, heads=4, layers=layers, context=context)
    tokens = torch.randint(0, vocab, (batch, context + 1))
    return model, (tokens[:, :-1], tokens[:, 1:]), batch * context


def _loss(model, inputs, targets):
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _compile(model, mode):
    if mode in ("eager", "adaptive", "graph"):
        return model
    return torch.compile(model, backend="inductor" if mode == "inductor" else "neuron")


def adaptive_for(mode: str) -> bool:
    """Adaptive eager as a mode runs: on for "adaptive", and for "compiled" as a user of torch.compile gets it by
    default (the loss and the optimizer's ops, outside the compiled graphs, queued and fused); off for "eager"."""
    return mode in ("adaptive", "compiled", "compiled+opt")


def _step_fns(factory, device, mode):
    torch.manual_seed(0)
    model, (inputs, targets), items = factory()
    model = model.to(device)
    inputs, targets = inputs.to(device), targets.to(device)
    runner = _compile(model, mode)
    if mode in ("graph", "compiled+graph"):
        # the step captured whole (torch.neuron.graph, as CUDA graphs capture it): AdamW's state on the device
        optimizer = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-4), capturable=True)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    # "compiled+opt": the optimizer step compiled too, as PyTorch's tutorials compile it
    step = torch.compile(optimizer.step, backend="neuron") if mode == "compiled+opt" else optimizer.step

    def train():
        optimizer.zero_grad(set_to_none=True)
        _loss(runner, inputs, targets).backward()
        step()

    def infer():
        with torch.no_grad():
            runner(inputs)

    if mode in ("graph", "compiled+graph"):
        return _captured(train), _captured(infer), items
    return train, infer, items


def _captured(step):
    """`step` run once (its optimizer state made), then captured: each call replays it."""
    step()
    graph = torch.neuron.NeuronGraph()
    with torch.neuron.graph(graph):
        step()
    return graph.replay


def run(device: str, smoke: bool, baseline: str = "cpu") -> list:
    repeats, inner = (2, 1) if smoke else (5, 3)
    factories = {"mlp": mlp, "cnn": cnn, "gpt": lambda: gpt(smoke)}
    rows = []
    for name, factory in factories.items():
        for phase in ("train", "infer"):
            row = {"benchmark": f"{name} {phase} step", "unit": "items/s"}
            configs = [(device, "eager"), (device, "adaptive"), (device, "compiled"), (device, "graph"),
                       (baseline, "eager"), (baseline, "inductor")]
            for target, mode in configs:
                label = f"{target} {mode}"
                if smoke and mode not in ("eager", "adaptive"):
                    continue
                try:
                    with torch.neuron.adaptive_eager(adaptive_for(mode)):
                        train, infer, items = _step_fns(factory, target, mode)
                        stats = measure(train if phase == "train" else infer, target, inner=inner, repeats=repeats)
                    row[label] = items / stats["median"]
                except Exception as exc:  # a configuration that cannot run is reported, not fatal
                    row[label] = f"n/a ({type(exc).__name__})"
                    print(f"{row['benchmark']}, {label}: {type(exc).__name__}: {exc}"[:2000], file=sys.stderr)
            print(row, file=sys.stderr, flush=True)
            rows.append(row)
    return rows
