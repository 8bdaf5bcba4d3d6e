"""The layering docs/architecture.md states: each layer imports only the layers below it, and no two
modules import each other (directly or through others). Imports inside functions count too."""
import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "torchneuron"

# bottom to top; a module may import its own layer and those before it
LAYERS = ["native", "runtime", "patches", "ops", "eager", "compile", "distributed", "library", "kernels",
          "profiler", "doctor", "device", "conformance", "vllm", "__init__", "__main__"]


def _modules() -> dict:
    return {".".join(path.relative_to(PACKAGE).with_suffix("").parts): path for path in PACKAGE.rglob("*.py")}


def _resolve(name: str, modules: dict):
    for candidate in (name, f"{name}.__init__" if name else "__init__"):
        if candidate in modules:
            return candidate
    return None


def _imports(name: str, path: pathlib.Path, modules: dict) -> set:
    """The torchneuron modules `name` imports."""
    package = name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[: len(package) - node.level + 1]
            module = node.module
        elif node.module and node.module.split(".")[0] == "torchneuron":
            base, module = [], node.module.partition(".")[2] or None
        else:
            continue
        target = ".".join(base + ([module] if module else []))
        for alias in node.names:
            imported = _resolve(f"{target}.{alias.name}" if target else alias.name, modules) or _resolve(target, modules)
            if imported is not None and imported != name:
                found.add(imported)
    return found


def _graph() -> dict:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _layer(module: str) -> int:
    top = module.split(".")[0]
    if top not in LAYERS:
        pytest.fail(f"torchneuron/{top} is in no layer: add it to LAYERS and to docs/architecture.md")
    return LAYERS.index(top)


def test_layers_import_only_downward():
    upward = sorted(f"{a} imports {b}" for a, targets in _graph().items() for b in targets if _layer(b) > _layer(a))
    assert not upward, upward


def test_no_import_cycles():
    graph = _graph()
    cycles = []
    for start in graph:
        # depth-first search for a path from one of start's imports back to start
        stack, seen = [(start, (start,))], set()
        while stack:
            node, path = stack.pop()
            for target in graph[node]:
                if target == start:
                    cycles.append(" -> ".join(path + (start,)))
                elif target not in seen:
                    seen.add(target)
                    stack.append((target, path + (target,)))
    assert not cycles, sorted(cycles)[:5]


def test_the_checker_sees_imports():
    """Not vacuous: the eager layer's dispatch is found importing the ops layer's rules, and a planted
    upward import would be caught."""
    graph = _graph()
    assert "ops.rules" in graph["eager.dispatch"]
    assert _layer("compile.backend") > _layer("eager.dispatch")
