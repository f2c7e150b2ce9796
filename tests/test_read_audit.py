"""One safe reader for every file the suite opens: a test lists every ``open``, ``read_text``,
``read_bytes``, ``OmegaConf.load``, ``pd.read_csv``/``read_parquet``, ``json.load``,
``yaml.load``/``safe_load``, ``torch.load`` and ``np.load`` in src/ and fails on any that does
not go through ``kernelzoo.records.files`` (``read_text``, ``read_bytes``, ``open_regular``:
regular files of bounded size, never a FIFO or a link), other than the few below, each with
its reason."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
READERS = {"read_text", "read_bytes"}  # methods: safe only as files.<name>(...)
LOADERS = {("OmegaConf", "load"), ("json", "load"), ("yaml", "load"), ("yaml", "safe_load"),
           ("torch", "load"), ("np", "load"), ("io", "open")}
TABLES = {"read_csv", "read_parquet"}  # pandas: safe only on io.StringIO / io.BytesIO

# (file, function): why its read needs no safe reader
ALLOWED = {
    ("kernelzoo/records/files.py", "umask"): "/proc/self/status: the kernel's, not the store's",
    ("kernelzoo/records/history.py", "cpu_model"): "/proc/cpuinfo: the kernel's",
    ("kernelzoo/records/rundir.py", "__init__"): "CurveWriter: opens curve.csv to write",
    ("kernelzoo/training/interrupt.py", "place"): "/proc/sys/kernel/random/boot_id: the kernel's",
    ("kernelzoo/training/interrupt.py", "_started"): "/proc/<pid>/stat: the kernel's",
    ("kernelzoo/training/interrupt.py", "descendants"): "/proc/<pid>/stat: the kernel's",
    ("kernelzoo/training/interrupt.py", "_status"): "/proc/<pid>/status: the kernel's",
    ("kernelzoo/training/workers.py", "_groups"): "/proc/self/cgroup: the kernel's",
    ("kernelzoo/training/workers.py", "_read"): "cgroup files under /sys/fs/cgroup: the kernel's",
    ("kernelzoo/training/shm.py", "record"): "/proc/<pid>/maps: the kernel's",
    ("kernelzoo/training/checkpoint.py", "read"): "torch.load of the file open_regular opened",
    ("kernelzoo/analysis/published.py", "load"): "the package's own data file",
    ("kernelzoo/bench/throughput.py", "_rss_mb"): "/proc/self/statm: the kernel's",
    ("kernelzoo/bench/throughput.py", "_peak_rss_mb"): "/proc/self/status: the kernel's",
    ("kernelzoo/bench/throughput.py", "peak_mb_here"): "/proc/self/clear_refs: written, not read",
}


def _reads(tree: ast.AST):
    """(function, source) of each audited call in ``tree`` that is not the safe reader."""
    def walk(node, function):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                else function
            if isinstance(child, ast.Call):
                f = child.func
                if isinstance(f, ast.Name) and f.id == "open":
                    yield name, ast.unparse(child)
                elif isinstance(f, ast.Attribute):
                    owner = f.value.id if isinstance(f.value, ast.Name) else None
                    if f.attr in READERS and owner != "files":
                        yield name, ast.unparse(child)
                    elif (owner, f.attr) in LOADERS:
                        yield name, ast.unparse(child)
                    elif f.attr in TABLES and owner in ("pd", "pandas") and not (
                            child.args and isinstance(child.args[0], ast.Call)
                            and ast.unparse(child.args[0].func) in ("io.StringIO", "io.BytesIO")):
                        yield name, ast.unparse(child)
            yield from walk(child, name)
    yield from walk(tree, "<module>")


def test_every_file_read_in_src_goes_through_the_safe_reader():
    found, used = [], set()
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for function, source in _reads(ast.parse(path.read_text(), str(path))):
            if (rel, function) in ALLOWED:
                used.add((rel, function))
            else:
                found.append(f"{rel}:{function}: {source}")
    assert not found, "reads outside kernelzoo.records.files:\n" + "\n".join(found)
    assert used == set(ALLOWED), f"allowed but no longer there: {set(ALLOWED) - used}"
