"""The package's import graph, read with ``ast`` (no module is imported): every import goes down the layering of
docs/design.md (its table is read from there: the page is the rule), no module reaches itself through imports (no
cycle), and games are reached through their registry.

Every ``import`` / ``from ... import`` statement counts, at module level or inside a function; ``from x
import y`` is an edge to the module ``x.y`` when that is a module of the package, else to ``x``;
relative imports are resolved. A package's ``__init__`` is the node of the package itself.
"""

import ast
import pathlib
import re

import pytest

import jaxrl_reason

PACKAGE = pathlib.Path(jaxrl_reason.__file__).parent
DESIGN = PACKAGE.parent / "docs" / "design.md"
OUTSIDE = ("experiments", "tests")  # the repository's scripts and tests: no package module imports them


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def import_lines(name: str, path: pathlib.Path, modules=MODULES) -> list[tuple[str, int]]:
    """(target, line) of every import in ``name``'s source: package modules (longest known prefix) and
    outside top-level names as written (``experiments...``)."""
    is_package = path.name == "__init__.py"
    targets = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: strip level - 1 parents of this module's package
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join(package + ([node.module] if node.module else []))
            targets += [(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base, node.lineno)
                        for alias in node.names]
    out = []
    for target, line in targets:
        parts = target.split(".")
        while len(parts) > 1 and ".".join(parts) not in modules:
            parts.pop()
        out.append((".".join(parts) if ".".join(parts) in modules else target, line))
    return sorted({(t, line) for t, line in out if t != name}, key=lambda x: (x[1], x[0]))


def imported(name: str, path: pathlib.Path, modules=MODULES) -> set[str]:
    """The names ``name`` imports anywhere in its source (``import_lines`` without the lines)."""
    return {target for target, _ in import_lines(name, path, modules)}


# ------------------------------------------------------------------------------ the layering
def read_layers(text: str) -> list[tuple[str, ...]]:
    """The rows of the table under ``## Layering`` (lowest first): each row's units as dotted names relative to the
    package (``rl/lm`` -> ``rl.lm``; ``agents/*``: kept as ``agents.*``, one unit per agent package)."""
    section = text.split("\n## Layering\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0].isdigit():
            rows[int(cells[0])] = tuple(u.strip("/").replace("/", ".") for u in re.findall(r"`([\w/*]+)`", cells[1]))
    assert rows and sorted(rows) == list(range(1, len(rows) + 1)), f"rows 1..n expected, got {sorted(rows)}"
    return [rows[i] for i in sorted(rows)]


def unit_index(layers: list[tuple[str, ...]], modules, top: str = "jaxrl_reason") -> dict[str, tuple[str, int]]:
    """module -> (its unit, its row): the longest unit that contains it; ``agents.*`` is ``agents`` and each package
    under it, one unit each; the package root (its ``__init__``: the version) is row 0. A module in no unit: absent."""
    rows = {}
    for row, names in enumerate(layers, start=1):
        for unit in names:
            if unit.endswith(".*"):
                parent = unit[:-2].split(".")
                rows[".".join(parent)] = row
                rows.update({".".join(m.split(".")[1:len(parent) + 2]): row for m in modules
                             if m.split(".")[1:len(parent) + 1] == parent and m.count(".") > len(parent)})
            else:
                rows[unit] = row
    out = {top: (top, 0)}
    for m in modules:
        rel = m.split(".")[1:]
        unit = next((".".join(rel[:k]) for k in range(len(rel), 0, -1) if ".".join(rel[:k]) in rows), None)
        if unit is not None:
            out[m] = (unit, rows[unit])
    return out


def layer_violations(edges: dict[str, list[tuple[str, int]]], index: dict[str, tuple[str, int]],
                     paths: dict[str, str] | None = None) -> list[str]:
    """One line per import that breaks the layering: into a higher row, into another unit of the same row, or into
    the repository's scripts / tests (``OUTSIDE``). ``edges``: module -> [(target, line)]."""
    bad = []
    for name, targets in sorted(edges.items()):
        unit, row = index[name]
        where = (paths or {}).get(name, name)
        for target, line in targets:
            if target.split(".")[0] in OUTSIDE:
                bad.append(f"{where}:{line}: {name} imports {target}: no package module imports the repository's "
                           f"{target.split('.')[0]}/")
            elif target in index and index[target][0] != unit and index[target][1] >= row:
                t_unit, t_row = index[target]
                rule = (f"{unit} (row {row}) and {t_unit} are independent units of one row" if t_row == row
                        else f"{unit} (row {row}) is below {t_unit} (row {t_row})")
                bad.append(f"{where}:{line}: {name} imports {target}: {rule} (docs/design.md#layering)")
    return bad


LAYERS = read_layers(DESIGN.read_text())
INDEX = unit_index(LAYERS, MODULES)


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
def graph_lines():
    return {name: import_lines(name, path) for name, path in MODULES.items()}


@pytest.fixture(scope="module")
def graph(graph_lines):
    return {name: {target for target, _ in lines} for name, lines in graph_lines.items()}


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


def test_the_layering_table_is_read():
    assert LAYERS[0] == ("parallel",) and ("rl", "search", "solvers") in LAYERS and LAYERS[-1] == ("experiments",)
    assert INDEX["jaxrl_reason.rl.lm.multiturn"] == ("rl.lm", LAYERS.index(("rl.lm",)) + 1)
    assert INDEX["jaxrl_reason.rl.onpolicy"][0] == "rl" and INDEX["jaxrl_reason.envs.games.arena"][0] == "envs"
    assert INDEX["jaxrl_reason.agents.spiral.rollout"][0] == "agents.spiral" and INDEX["jaxrl_reason"][1] == 0


def test_every_module_is_in_a_layer():
    missing = sorted(set(MODULES) - set(INDEX))
    assert not missing, "modules in no unit of the layering table (docs/design.md#layering): " + ", ".join(missing)


def test_imports_go_down_the_layering(graph_lines):
    paths = {name: str(path.relative_to(PACKAGE.parent)) for name, path in MODULES.items()}
    bad = layer_violations(graph_lines, INDEX, paths)
    assert not bad, "imports that go up the layering:\n" + "\n".join(bad)


def test_the_layering_check_fails_on_an_upward_import(tmp_path):
    """A synthetic graph with each kind of bad edge (and good ones), then a real module copied with one bad
    function-level import added: each is reported with its module, line and rule."""
    edges = {"jaxrl_reason.tasks.tool_calc": [("jaxrl_reason.rl.lm.multiturn", 30), ("jaxrl_reason.envs.text", 31)],
             "jaxrl_reason.rl.lm.update": [("jaxrl_reason.rl.grpo.update", 35), ("jaxrl_reason.rl.update", 36)],
             "jaxrl_reason.rl.grpo.agent": [("jaxrl_reason.rl.marl.qmix", 7), ("jaxrl_reason.rl.lm.loss", 8)],
             "jaxrl_reason.agents.spiral.rollout": [("jaxrl_reason.agents.memagent.agent", 3), ("jaxrl_reason.rl.lm", 4)],
             "jaxrl_reason.data.datasets": [("jaxrl_reason.tasks.base", 22), ("jaxrl_reason", 23)],
             "jaxrl_reason.rl.onpolicy": [("experiments.x", 9), ("numpy", 10)]}
    bad = layer_violations(edges, INDEX)
    assert [line.split(": ")[0] for line in bad] == [
        "jaxrl_reason.agents.spiral.rollout:3", "jaxrl_reason.data.datasets:22", "jaxrl_reason.rl.grpo.agent:7",
        "jaxrl_reason.rl.lm.update:35", "jaxrl_reason.rl.onpolicy:9", "jaxrl_reason.tasks.tool_calc:30"]
    row = {u: i for i, units in enumerate(LAYERS, start=1) for u in units}
    assert bad[-1] == (f"jaxrl_reason.tasks.tool_calc:30: jaxrl_reason.tasks.tool_calc imports jaxrl_reason.rl.lm.multiturn:"
                       f" tasks (row {row['tasks']}) is below rl.lm (row {row['rl.lm']}) (docs/design.md#layering)")
    assert "independent units of one row" in bad[0] and "independent units of one row" in bad[2]
    assert "repository's experiments/" in bad[4]

    name, source = "jaxrl_reason.tasks.tool_calc", MODULES["jaxrl_reason.tasks.tool_calc"].read_text()
    copy = tmp_path / "tool_calc.py"
    copy.write_text(source + "\n\ndef _late():\n    from jaxrl_reason.rl.lm.multiturn import make_rollout\n")
    line = len(source.splitlines()) + 4
    assert layer_violations({name: import_lines(name, MODULES[name])}, INDEX) == []
    bad = layer_violations({name: import_lines(name, copy)}, INDEX)
    assert len(bad) == 1 and bad[0].startswith(f"{name}:{line}: {name} imports jaxrl_reason.rl.lm.multiturn: tasks")


def test_moved_names_keep_their_old_paths():
    """Names moved down the layering are still importable where they were (the old module re-exports them)."""
    from jaxrl_reason.envs import text
    from jaxrl_reason.rl import onpolicy, update
    from jaxrl_reason.rl.grpo import update as grpo_update
    from jaxrl_reason.rl.lm import multiturn
    from jaxrl_reason.rl.marl import common

    assert (multiturn.TextEnv, multiturn.HostTextEnv, multiturn.TextStep) == (text.TextEnv, text.HostTextEnv,
                                                                              text.TextStep)
    assert (grpo_update.gradient_step, grpo_update.minibatch_epochs) == (update.gradient_step, update.minibatch_epochs)
    assert common.flat_obs is onpolicy.flat_obs


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
