"""How the repository's code hangs together, read from the source (no imports run): ``pipeline`` may use ``tools``,
never the reverse; no circle of imports among our modules; the artifact's code carries no measured figures in its
comments and docstrings (they live in results, with the command that made them)."""

import ast
import io
import re
import tokenize
from pathlib import Path

from conftest import ROOT

PACKAGES = ("tools", "pipeline")


def our_modules() -> dict[str, Path]:
    """Module name -> file, for the root's code files and the packages' modules."""
    modules = {path.stem: path for path in ROOT.glob("*.py")}
    for package in PACKAGES:
        modules |= {f"{package}.{path.stem}": path for path in (ROOT / package).glob("*.py") if path.stem != "__init__"}
    return modules


def imported_names(path: Path) -> set[str]:
    """Every module an import in ``path`` names (function-level imports too), relative imports of the root's
    flat modules as their plain names."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            names.add(base)
            names |= {f"{base}.{alias.name}" if base else alias.name for alias in node.names}
    return names


def import_graph() -> dict[str, set[str]]:
    modules = our_modules()
    return {name: {imported for imported in imported_names(path) if imported in modules and imported != name}
            for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_tools_never_import_pipeline():
    offenders = sorted(f"{name} imports {imported}" for name, imported_set in import_graph().items()
                       if name.startswith("tools.") for imported in imported_set if imported.startswith("pipeline."))
    assert not offenders, "tools/ must not import pipeline/ (pipeline -> tools only): " + "; ".join(offenders)


def test_no_import_circles():
    assert circles(import_graph()) == []


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# hardware named, or a time in micro/milliseconds or a percentage: what one machine measured on one day
MEASURED = re.compile(r"\b(H100|H200|A100|EPYC|Xeon)\b|\d(\.\d+)? ?(us|ms|µs)\b|\d %")


def comments_and_strings(path: Path):
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if token.type in (tokenize.COMMENT, tokenize.STRING):
            yield token.start[0], token.string


def test_artifact_code_carries_no_measured_figures():
    found = [f"{path.name}:{line}: {match.group(0)!r}" for path in sorted(ROOT.glob("*.py"))
             for line, text in comments_and_strings(path) for match in MEASURED.finditer(text)]
    assert not found, "measured figures belong in results, not in code: " + "; ".join(found)
