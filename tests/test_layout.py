"""The house's structure (issue 23): small modules, imports that run one way, the engine blind to
the device. Read from the source with `ast`, so a new import that breaks a rule fails here."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "oxinfer"
MAX_LINES = 500


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The oxinfer modules a file imports, at any depth (lazy imports too), but for TYPE_CHECKING."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("oxinfer")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("oxinfer"):
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}  # `from pkg import module`
    return out


FILES = sorted(ROOT.rglob("*.py"))
MODULES = {_module(p): p for p in FILES}
GRAPH = {m: {i for i in _imports(p) if i in MODULES and i != m and not m.startswith(i + ".")}
         for m, p in MODULES.items()}


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_longer_than_500_lines(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES


def test_the_imports_have_no_circle():
    """Each module's imports, followed to the end, never come back to it (a package's modules may
    import each other in one direction; a package's __init__ re-exporting its modules is fine)."""
    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in GRAPH[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    circles = [m for m in MODULES if m in reach(m) and not MODULES[m].name == "__init__.py"]
    assert not circles, circles


def test_the_engine_imports_nothing_of_the_webgpu_package_and_the_server_nothing_of_ray():
    for m, deps in GRAPH.items():
        if m.startswith("oxinfer.engine"):
            assert not {d for d in deps if d.startswith("oxinfer.runtime.webgpu")}, m
        if m.startswith("oxinfer.server"):
            assert not {d for d in deps if d.startswith("oxinfer.serve_ray")}, m
    only_webgpu = {m for m, deps in GRAPH.items() if "oxinfer.runtime.webgpu.device" in deps}
    assert only_webgpu <= {m for m in MODULES if m.startswith("oxinfer.runtime.webgpu")}, only_webgpu
