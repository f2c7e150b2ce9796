"""The three pieces of Hydra that its public API does not offer, in one place.

Everything else in kernelzoo uses Hydra's public modules (``hydra``, ``hydra.core``,
``hydra.types``, ``hydra.errors``, ``hydra.plugins``). These come from ``hydra._internal`` and
may move between Hydra releases; pyproject pins hydra-core to 1.3.x, and a change shows here:

- ``args_parser``: Hydra's command-line parser, so that a command line is checked (and its
  ``--help``, ``--cfg`` requests recognised) exactly as Hydra will read it, before Hydra creates
  any directory;
- ``apply_overrides``: plain ``key=value`` overrides applied to a composed config as Hydra's
  config loader applies them (the sweeper composes once per choice of config groups);
- ``sweeper_base``: the sweeper the grid-union sweeper extends (argument splitting, batches).
  It is looked up when the sweeper's module is defined, not imported here: Hydra's plugin scan
  executes its core plugins' modules afresh, and a class imported before that scan would not be
  the one Hydra's own code refers to.
"""

from __future__ import annotations

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import get_args_parser
from omegaconf import DictConfig

__all__ = ["apply_overrides", "args_parser", "sweeper_base"]


def args_parser():
    """Hydra's argparse parser of a Hydra app's command line."""
    return get_args_parser()


def apply_overrides(overrides: list, cfg: DictConfig) -> None:
    """Apply parsed plain overrides (``hydra.core.override_parser`` Override objects) to
    ``cfg`` in place, as Hydra's config loader does."""
    ConfigLoaderImpl._apply_overrides_to_config(overrides, cfg)


def sweeper_base() -> type:
    """Hydra's BasicSweeper class, as its plugin scan loaded it."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return BasicSweeper
