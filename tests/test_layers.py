"""The packages are layers: every import of kernelzoo's own code points downward, and no module
reaches itself through its imports (README, Code). Imports inside functions count as well."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# a unit (a package, or a module of the top level) and its layer; a unit imports only units of
# a lower layer, or itself
LAYER = {
    "kernelzoo": 0, "kernelzoo.config": 0,
    "kernelzoo.maps": 1,
    "kernelzoo.core": 2, "kernelzoo.records": 2,
    "kernelzoo.training": 3, "kernelzoo.analysis": 3,
    "kernelzoo.report": 4,  # the presentation: takes an Analysis
    "kernelzoo.train": 5, "kernelzoo.analyze": 5, "kernelzoo.compare": 5,
    "kernelzoo.sweep": 6,  # the front door of train's Hydra app
    "kernelzoo.bench": 6,  # measures runs through the trainer's command (training.job.run)
    "hydra_plugins.kernelzoo_sweeper": 6,
}


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``name`` imports (``from pkg import module`` included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


def unit(module: str) -> str:
    for size in (3, 2, 1):
        head = ".".join(module.split(".")[:size])
        if head in LAYER:
            return head
    raise AssertionError(f"{module} belongs to no layer: add it to LAYER")


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def test_every_module_belongs_to_a_layer():
    for name in graph():
        unit(name)


# the modules at the top of the package: the commands alone (and the docs generator, until it
# moves to scripts/); everything else lives in a package of its layer
ENTRY_POINTS = {"kernelzoo.train", "kernelzoo.sweep", "kernelzoo.analyze", "kernelzoo.compare",
                "kernelzoo.results_doc"}


def test_only_the_entry_points_sit_at_the_top_of_the_package():
    top = {name for name, path in modules().items()
           if name.startswith("kernelzoo.") and path.parent == SRC / "kernelzoo"}
    assert top <= ENTRY_POINTS, sorted(top - ENTRY_POINTS)


def test_imports_point_downward():
    upward = [f"{a} -> {b}" for a, deps in graph().items() for b in deps
              if unit(a) != unit(b) and LAYER[unit(b)] >= LAYER[unit(a)]]
    assert not upward, upward


def test_no_module_imports_itself_through_others():
    edges = graph()
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for dep in sorted(edges[node]):
            if state.get(dep) == 1:
                return path + [node, dep]
            if dep not in state and (cycle := visit(dep, path + [node])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state:
            assert (cycle := visit(start, [])) is None, " -> ".join(cycle)


def test_the_analysis_never_imports_training_and_the_sweeper_never_the_commands():
    edges = graph()
    for a, deps in edges.items():
        if unit(a) == "kernelzoo.analysis":
            assert not {d for d in deps if unit(d) == "kernelzoo.training"}, a
        if unit(a) == "hydra_plugins.kernelzoo_sweeper":
            assert not deps & {"kernelzoo.train", "kernelzoo.analyze", "kernelzoo.sweep"}, a


def test_only_the_adapter_reaches_into_hydra_internals():
    users = [name for name, path in modules().items() if "hydra._internal" in path.read_text()]
    assert users == ["kernelzoo.config.hydra_internals"], users


def markdown(node: ast.AST) -> bool:
    """Whether a string literal (an f-string's literal parts included) writes markdown: a table
    row or rule, a heading, or bold text."""
    text = node.value if isinstance(node, ast.Constant) else ""
    return isinstance(text, str) and (text.lstrip().startswith(("| ", "|---", "#")) or "**" in text)


def test_the_analysis_holds_rules_and_the_report_writes_the_markdown():
    """analysis/ computes; its report sections (and their markdown) live in report/."""
    found = []
    for name, path in modules().items():
        if unit(name) != "kernelzoo.analysis":
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                      and isinstance(n.body[0], ast.Expr)}
        found += [f"{name}.{n.name}" for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                  and (n.name == "section" or n.name.endswith("_section"))]
        found += [f"{name}:{n.lineno} {n.value!r}" for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and id(n) not in docstrings and markdown(n)]
    assert not found, found
