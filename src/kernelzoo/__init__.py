"""kernelzoo: capacity experiments for linear-attention feature maps."""

__version__ = "0.1.0"
