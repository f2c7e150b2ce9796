"""Config node of the grid sweeper: ``hydra/sweeper=grid``."""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class GridSweeperConf:
    _target_: str = "hydra_plugins.kernelzoo_sweeper.grid_sweeper.GridSweeper"
    max_batch_size: Optional[int] = None
    params: Optional[Dict[str, Any]] = None
    grids: Optional[List[Dict[str, Any]]] = None


ConfigStore.instance().store(group="hydra/sweeper", name="grid", node=GridSweeperConf,
                             provider="kernelzoo")
