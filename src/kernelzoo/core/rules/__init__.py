"""The update rules of the fast-weight memory, one module each (``base.UpdateRule`` is the
contract): a module of this package that defines ``RULE`` is a rule, named by the module.

A new rule is one file here, its YAML in conf/memory/ and its test against the literal
recurrence (tests/test_rules.py runs every rule's ``read`` against ``step``, values and
gradients). Every other layer asks the rule (``get(name)``) for what it needs, never its name.
"""

from __future__ import annotations

import importlib
import pkgutil

from kernelzoo.core.rules.base import Sizes, UpdateRule

RULES: dict[str, UpdateRule] = {}
for _module in pkgutil.iter_modules(__path__):
    _rule = getattr(importlib.import_module(f"{__name__}.{_module.name}"), "RULE", None)
    if _rule is not None:
        RULES[_rule.name] = _rule


def get(name: str) -> UpdateRule:
    """The rule called ``name``; a ValueError naming the valid ones otherwise."""
    try:
        return RULES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown update_rule {name!r}; valid: {', '.join(RULES)}") from None


__all__ = ["RULES", "Sizes", "UpdateRule", "get"]
