"""An image-classification training template built on PyTorch Lightning."""

__version__ = "0.1.0"
