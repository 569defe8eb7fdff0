"""The package's import graph has no cycles and follows the pipeline's stages: module-level
and function-level imports alike (every ``import`` statement anywhere in a module counts),
over variantlab and the built-in plugins (variantlab_plugins)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"variantlab": ROOT / "variantlab", "variantlab_plugins": ROOT / "variantlab_plugins"}


def modules() -> dict[str, Path]:
    found = {}
    for package, base in PACKAGES.items():
        for path in base.rglob("*.py"):
            parts = [package, *path.relative_to(base).with_suffix("").parts]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(module: str, node: ast.Import | ast.ImportFrom, is_package: bool,
             known: dict[str, Path]) -> set[str]:
    """The known modules one import statement of ``module`` loads. A submodule importing its
    own parent package is not an edge (the parent is already being imported)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            here = module.split(".") if is_package else module.split(".")[:-1]
            here = here[: len(here) - (node.level - 1)]
            base = ".".join(here + ([node.module] if node.module else []))
        subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
        names = subs + ([base] if len(subs) < len(node.names) else [])
    out = set()
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module and not module.startswith(name + "."):
            out.add(name)
    return out


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph = {}
    for module, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[module] = set().union(*(
            imported(module, node, path.name == "__init__.py", known)
            for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 50 and "variantlab.sweep.units" in graph["variantlab.executors.base"]
    assert cycles(graph) == []


def test_the_checker_finds_a_cycle_hidden_in_a_function():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    tree = ast.parse("def f():\n    from ..plugin.registry import Registry\n")
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    known = {"variantlab.model.specs": Path(), "variantlab.plugin.registry": Path()}
    assert imported("variantlab.model.specs", node, False, known) == {"variantlab.plugin.registry"}


#: the core's folders in pipeline order (docs/architecture.md): a module may import from its
#: own folder and from earlier stages, never from a later one. The top-level modules
#: (errors.py, version.py, the public API in __init__.py, __main__.py) stand outside the stages.
STAGES = ("plugin", "model", "data", "store", "probes", "config", "sweep", "executors",
          "hf", "report", "export", "testing", "cli")


def stage_of(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "variantlab" or len(parts) < 2 or parts[1] not in STAGES:
        return None
    return STAGES.index(parts[1])


def later_stage_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((m, dep) for m, deps in graph.items() for dep in deps
                  if stage_of(m) is not None and stage_of(dep) is not None
                  and stage_of(dep) > stage_of(m))


def test_every_core_folder_is_a_stage_and_no_module_imports_a_later_stage():
    graph = import_graph()
    folders = {p.name for p in PACKAGES["variantlab"].iterdir()
               if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(STAGES)
    top = {m for m in graph if m.startswith("variantlab.") and stage_of(m) is None}
    assert top == {"variantlab.errors", "variantlab.version", "variantlab.__main__"}
    assert later_stage_imports(graph) == []


def test_the_stage_check_finds_an_import_from_a_later_stage():
    graph = {"variantlab.model.build": {"variantlab.plugin.registry", "variantlab.report.plots"},
             "variantlab.cli.main": {"variantlab.model.build"}}
    assert later_stage_imports(graph) == [("variantlab.model.build", "variantlab.report.plots")]
