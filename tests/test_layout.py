"""The floor plan: nestgate's modules in layers, every import running down.

The import graph is read from the installed package's source with `ast`: every
`import` and `from ... import` anywhere in a module counts, at the top or inside a
function (a lazy import is still a dependency; it only moves the moment it bites).
There are no `if TYPE_CHECKING:` imports in the package; if one is added, it counts
too. Strings handed to `importlib.import_module` (the supervisor's pre-import of the
handlers a config needs) name modules the worker will run, not ones the supervisor
depends on, and are not edges.

A module may import modules of its own layer and of the layers below it; the graph
has no circle, inside a layer either.
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import nestgate

PACKAGE = Path(nestgate.__file__).parent

# Top to bottom; each folder is a layer, and a module belongs to the layer of the
# longest prefix that names it. A few modules sit in the folder of their subject but a
# layer of their own: the commands of admin/, bans/ and certs/ (cli); the admin
# process and the workers' shared table (server); the stores, ban tables and
# certificate files that everything above reads (state); the sites' ban watch and
# CrowdSec's decisions (pipeline, beside the gates that refuse what they decide).
# Handlers sit above the pipeline: a handler may use the route table, the network
# rules, the resolve step or the ban notices, while the pipeline reaches handlers only
# through the contract in base/handler.py. What puts handlers into route tables
# (sites/) is above both; wire/ and handlers/ never import each other.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("cli", ("nestgate.__main__", "nestgate.cli", "nestgate.allowcli", "nestgate.admin.ctl",
             "nestgate.bans.cli", "nestgate.certs.cli", "nestgate.bench")),
    ("server", ("nestgate.server", "nestgate.admin.keeper", "nestgate.admin.process",
                "nestgate.admin.stats")),
    ("admin", ("nestgate.admin",)),
    ("config", ("nestgate.config",)),
    ("sites", ("nestgate.sites",)),
    ("wire", ("nestgate.wire",)),
    ("handlers", ("nestgate.handlers",)),
    ("pipeline", ("nestgate.pipeline", "nestgate.bans.watch", "nestgate.bans.decisions",
                  "nestgate.bans.crowdsec")),
    ("state", ("nestgate.handlers.auth.store", "nestgate.handlers.auth.redisstore",
               "nestgate.handlers.auth.sessiontoken",
               "nestgate.handlers.auth.storerules", "nestgate.bans", "nestgate.certs",
               "nestgate.admin.config", "nestgate.admin.token")),
    ("base", ("nestgate", "nestgate.base")),
]
# Named alone, not with what lies below: a new module at the top of the package must
# be given a layer (and a folder), not fall into the base one.
EXACT = {"nestgate"}
RANK = {name: rank for rank, (name, _) in enumerate(LAYERS)}


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imported(module: str, node, is_package: bool, names) -> list[str]:
    """The package's modules one import statement names, as module names."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".")[: len(module.split(".")) - node.level + is_package]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        # `from nestgate.x import y` imports nestgate.x.y when y is a module, else nestgate.x
        targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in names else source
                   for alias in node.names]
    found = []
    for target in targets:
        while target not in names and "." in target:
            target = target.rsplit(".", 1)[0]
        if target in names and target != module and target.split(".")[0] == "nestgate":
            found.append(target)
    return found


def import_graph() -> dict[str, set[str]]:
    names = module_names()
    graph = collections.defaultdict(set)
    for module, path in names.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[module].update(imported(module, node, path.name == "__init__.py", names))
        graph[module]  # every module is a node, importing something or not
    return graph


def layer_of(module: str) -> str:
    best, length = None, -1
    for name, prefixes in LAYERS:
        for prefix in prefixes:
            below = module.startswith(prefix + ".") and prefix not in EXACT
            if (module == prefix or below) and len(prefix) > length:
                best, length = name, len(prefix)
    return best


def circles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return found


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in module_names() if layer_of(m) is None)
    assert not unplaced, f"modules in no layer (add them to LAYERS): {unplaced}"


def test_the_import_graph_has_no_circle():
    graph = import_graph()
    found = circles(graph)
    described = []
    for component in found:
        members = set(component)
        described.append("; ".join(f"{m} -> {', '.join(sorted(graph[m] & members))}"
                                   for m in component))
    assert not found, "import circles:\n" + "\n".join(described)


def test_every_import_runs_to_the_same_layer_or_below():
    upward = []
    for module, targets in sorted(import_graph().items()):
        for target in sorted(targets):
            if RANK[layer_of(target)] < RANK[layer_of(module)]:
                upward.append(f"{module} ({layer_of(module)}) -> {target} ({layer_of(target)})")
    assert not upward, "imports running up a layer:\n" + "\n".join(upward)


def test_the_checker_sees_imports_inside_functions_and_relative_ones():
    """The graph is only as good as the reader: a lazy import and a relative one count."""
    graph = import_graph()
    assert "nestgate.cli" in graph["nestgate.__main__"]          # from nestgate.cli import main
    source = ast.parse("def f():\n    from .replies import reply\n")
    node = source.body[0].body[0]
    assert imported("nestgate.admin.api", node, False, module_names()) == \
        ["nestgate.admin.replies"]
