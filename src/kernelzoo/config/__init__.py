"""The configuration layer, below every other: the typed schema and the checks of a command line
(``schema``), the only use of Hydra's internals (``hydra_internals``), and how a count reads
(``words``). ``from kernelzoo import config; config.compose(...)`` reaches the schema's names."""

from kernelzoo.config.schema import (CONF, EXPERIMENTS, NORMALISATIONS, UPDATE_RULES,
                                     AnalyzeConfig, Config, LoggerConf, MemoryConf, SearchConf,
                                     TaskConf, TrainerConf, UsageError, as_job, check, check_chdir,
                                     check_store_place, compose, describe, expand_home, is_name,
                                     sequence_lengths, show, task_overrides, writable)

__all__ = ["CONF", "EXPERIMENTS", "NORMALISATIONS", "UPDATE_RULES", "AnalyzeConfig", "Config",
           "LoggerConf", "MemoryConf", "SearchConf", "TaskConf", "TrainerConf", "UsageError",
           "as_job", "check", "check_chdir", "check_store_place", "compose", "describe",
           "expand_home", "is_name", "sequence_lengths", "show", "task_overrides",
           "writable"]
