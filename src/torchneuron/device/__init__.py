"""The `neuron` device: registration with PyTorch and the `torch.neuron` module."""
