"""No module takes another module's private names: ``from x import _name`` (or ``x._name`` of an
imported module ``x``) reaches into code that is free to change; what another module needs is
public (README, Code). Dunders (``__version__``) are public."""

from __future__ import annotations

import ast

from test_layers import modules


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def reached(path) -> list[str]:
    """The private names ``path`` imports from, or reads off, another module of its own code."""
    tree = ast.parse(path.read_text())
    found, aliases = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(
                ("kernelzoo", "hydra_plugins"))):
            found += [f"from {'.' * node.level}{node.module or ''} import {a.name}"
                      for a in node.names if private(a.name)]
            aliases |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            aliases |= {(a.asname or a.name).split(".")[0] for a in node.names
                        if a.name.startswith(("kernelzoo", "hydra_plugins"))}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr) and \
                isinstance(node.value, ast.Name) and node.value.id in aliases:
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_no_module_imports_another_modules_private_names():
    found = {name: hits for name, path in modules().items() if (hits := reached(path))}
    assert not found, found
