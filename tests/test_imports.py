"""The import structure between opfusion's packages: read from each module's ``import``
statements (module level and inside functions) with ``ast``, so nothing is executed.

The arrows that keep the layers apart: tensor expressions build on the loop IR (``te/`` ->
``tir/``, lowering included, never back); the ``opf.op`` builders are generated from the
operator declarations (``op/`` -> ``opdefs/``, never back); FusionMerge builds on FuseOps'
analysis (``transform/fusion/`` -> ``transform/fuse/``, never back); and no cycle runs among
the packages of the front half of the pipeline."""

import ast
import functools
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "opfusion"

#: Packages whose imports of each other must form no cycle.
ACYCLIC = ("opfusion.frontend", "opfusion.op", "opfusion.opdefs", "opfusion.te",
           "opfusion.tir", "opfusion.transform")


def _module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def _imported(path: Path) -> set[str]:
    """Every opfusion module (or name in one) that ``path`` imports, as an absolute name."""
    name, is_package = _module_name(path)
    here = name.split(".") if is_package else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return {target for target in found if target.split(".")[0] == "opfusion"}


@functools.cache
def _module_imports() -> dict[str, set[str]]:
    return {_module_name(path)[0]: _imported(path) for path in sorted(PACKAGE.rglob("*.py"))}


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _offenders(source: str, target: str) -> list[str]:
    return sorted(f"{module} imports {imported}"
                  for module, imports in _module_imports().items() if _inside(module, source)
                  for imported in imports if _inside(imported, target))


@pytest.mark.parametrize("source, target", [
    ("opfusion.tir", "opfusion.te"),
    ("opfusion.opdefs", "opfusion.op"),
    ("opfusion.transform.fuse", "opfusion.transform.fusion"),
])
def test_lower_layers_never_import_higher_ones(source, target):
    # "opfusion.op" must not match "opfusion.opdefs": _inside compares whole name parts.
    assert _offenders(source, target) == []


def test_tensor_expressions_build_on_the_loop_ir():
    assert _offenders("opfusion.te", "opfusion.tir")  # the arrow that must exist: te -> tir


def test_no_import_cycle_among_the_front_packages():
    graph: dict[str, set[str]] = defaultdict(set)
    for module, imports in _module_imports().items():
        source = next((p for p in ACYCLIC if _inside(module, p)), None)
        for imported in imports:
            target = next((p for p in ACYCLIC if _inside(imported, p)), None)
            if source and target and source != target:
                graph[source].add(target)
    # Acyclic iff repeatedly removing the packages that import none of the others empties it.
    remaining = {package: set(graph[package]) for package in ACYCLIC}
    while True:
        leaves = [p for p, targets in remaining.items() if not targets]
        if not leaves:
            break
        for package in leaves:
            del remaining[package]
        for targets in remaining.values():
            targets.difference_update(leaves)
    assert remaining == {}, f"packages in an import cycle: {remaining}"
