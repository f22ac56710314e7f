"""The package's import graph, read with ``ast`` (no module is imported): the generic layers never import
their users (no ``envs/``, ``rl/``, ``models/``, ``search/`` or ``solvers/`` module imports from
``jaxrl_reason.agents`` or ``experiments``) and no module reaches itself through imports (no cycle).

Every ``import`` / ``from ... import`` statement counts, at module level or inside a function; ``from x
import y`` is an edge to the module ``x.y`` when that is a module of the package, else to ``x``;
relative imports are resolved. A package's ``__init__`` is the node of the package itself.
"""

import ast
import pathlib

import pytest

import jaxrl_reason

PACKAGE = pathlib.Path(jaxrl_reason.__file__).parent
GENERIC = ("envs", "rl", "models", "search", "solvers")  # layers that must not know their users
UPWARD = ("jaxrl_reason.agents", "jaxrl_reason.experiments", "experiments")


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: pathlib.Path, modules=MODULES) -> set[str]:
    """Names ``name`` imports anywhere in its source: package modules (longest known prefix) and
    outside top-level names as written (``experiments...``)."""
    is_package = path.name == "__init__.py"
    targets = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: strip level - 1 parents of this module's package
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join(package + ([node.module] if node.module else []))
            targets += [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                        for alias in node.names]
    out = set()
    for target in targets:
        parts = target.split(".")
        while len(parts) > 1 and ".".join(parts) not in modules:
            parts.pop()
        out.add(".".join(parts) if ".".join(parts) in modules else target)
    out.discard(name)
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle ``[a, b, ..., a]`` of ``graph`` (name -> names it imports), or None (iterative DFS)."""
    state = {}  # 1: on the current path, 2: done
    for root in sorted(graph):
        if state.get(root):
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif nxt in graph and state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt in graph and not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


@pytest.fixture(scope="module")
def graph():
    return {name: imported(name, path) for name, path in MODULES.items()}


def test_the_walker_sees_function_level_and_relative_imports(tmp_path, graph):
    assert "jaxrl_reason.envs" in graph["jaxrl_reason.rl.marl.qmix"]
    src = tmp_path / "pkg" / "sub"
    src.mkdir(parents=True)
    (src / "mod.py").write_text("from . import other\n"
                                "def f():\n    from ..top import thing\n    import experiments.x\n")
    modules = {"pkg.sub.mod": None, "pkg.sub.other": None, "pkg.top": None}
    assert imported("pkg.sub.mod", src / "mod.py", modules) == {"pkg.sub.other", "pkg.top", "experiments.x"}


def test_find_cycle_reports_the_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c", "os"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_generic_layers_do_not_import_their_users(graph):
    upward = sorted(f"{name} -> {target}" for name, targets in graph.items()
                    if name.split(".")[1:2] and name.split(".")[1] in GENERIC
                    for target in targets if target.startswith(UPWARD))
    assert not upward, "generic layers import their users:\n" + "\n".join(upward)


def test_the_package_import_graph_has_no_cycle(graph):
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_games_are_reached_through_the_registry(graph):
    """Adding a game touches its own package (``envs/games/<name>/``) and one registry line: outside that package
    and the registry (``envs.games``), no module imports a game package; SPIRAL, self-play, AlphaZero and the
    arena read ``envs.games.GAMES`` (its ``GameSpec``). Experiment scripts may: they study particular games."""
    games = {f"jaxrl_reason.envs.games.{d.name}" for d in (PACKAGE / "envs" / "games").iterdir()
             if (d / "__init__.py").is_file()}
    assert {"jaxrl_reason.envs.games.kuhn_poker", "jaxrl_reason.envs.games.liars_dice"} <= games

    def inside(name, game):
        return name == game or name.startswith(game + ".")

    direct = sorted(f"{name} -> {target}" for name, targets in graph.items()
                    if name != "jaxrl_reason.envs.games" and not name.startswith("jaxrl_reason.experiments")
                    for target in targets for game in games if inside(target, game) and not inside(name, game))
    assert not direct, "modules that import a game package instead of reading its GameSpec:\n" + "\n".join(direct)
