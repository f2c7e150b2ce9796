"""The packages import only downward: entry points and the sweeper plugin -> analysis / training
-> records / core -> maps -> config, words; analysis and training never import each other, nor
core and records; no package imports an entry point (a command line)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ENTRY_POINTS = {"kernelzoo.train", "kernelzoo.sweep", "kernelzoo.analyze", "kernelzoo.results_doc"}
BASE = {"kernelzoo", "kernelzoo.__version__", "kernelzoo.config", "kernelzoo.words"}
ALLOWED = {  # a package: the kernelzoo packages it may import besides its own and BASE
    "maps": set(),
    "core": {"maps"},
    "records": set(),
    "training": {"maps", "core", "records"},
    "analysis": {"maps", "core", "records", "search"},
    "bench": {"maps", "core", "records", "training"},
}


def imports(file: Path) -> set[str]:
    """The kernelzoo modules ``file`` imports, at its top or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= ({f"kernelzoo.{a.name}" for a in node.names} if node.module == "kernelzoo"
                      else {node.module})
    return {m for m in found if m.split(".")[0] == "kernelzoo"}


def layer(module: str) -> str:
    """``kernelzoo.analysis.runs`` -> ``analysis``; a top-level module is its own name."""
    return module.split(".")[1] if module.count(".") else ""


def test_packages_import_only_downward():
    wrong = []
    for package, allowed in ALLOWED.items():
        for file in sorted((SRC / "kernelzoo" / package).rglob("*.py")):
            for module in imports(file):
                if module in BASE or layer(module) in {package, *allowed}:
                    continue
                wrong.append(f"{file.relative_to(SRC)} imports {module}")
    assert not wrong, wrong


def test_the_sweeper_plugin_imports_no_command_line():
    wrong = [f"{file.relative_to(SRC)} imports {module}"
             for file in sorted((SRC / "hydra_plugins").rglob("*.py"))
             for module in imports(file) if module in ENTRY_POINTS]
    assert not wrong, wrong
