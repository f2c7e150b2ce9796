"""Hydra plugin: the grid-union sweeper of kernelzoo (``hydra/sweeper=grid``)."""

from . import config  # noqa: F401  registered through a normal import (Hydra's scan needs it)
