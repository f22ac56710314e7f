"""The tests mirror the package (one test module per module or sub-package, as optax and mctx do).

``tests/<path>/test_<name>.py`` tests ``jaxrl_reason/<path>/<name>.py`` or the sub-package
``jaxrl_reason/<path>/<name>/``; ``tests/<path>/<pkg>/test_<pkg>.py`` tests the sub-package
``<path>/<pkg>`` as a whole, and ``test_<name>_<topic>.py`` is a second module for ``<name>`` where one
file would mix unrelated fixtures. Three folders are cross-cutting by design: ``notebooks/`` (one test
module per notebook, named after it), ``faults/`` (fault injection) and ``project/`` (README, docs,
packaging, import graph, notebook outputs, this layout).

Every test folder is a package (``__init__.py``), so basenames may repeat across folders under pytest's
default ``prepend`` import mode; ``tests/`` itself is not one, so its ``conftest.py`` (XLA flags before
jax is imported) puts ``tests/`` on ``sys.path`` and ``import testutil`` / ``from nbutil import ...`` work
from every folder.
"""

import pathlib

import jaxrl_reason

TESTS = pathlib.Path(__file__).resolve().parents[1]
REPO = TESTS.parent
PACKAGE = pathlib.Path(jaxrl_reason.__file__).resolve().parent
CROSS_CUTTING = {"notebooks", "faults", "project", "realmodel"}  # realmodel: every LM capability on one real model
HELPERS = {"conftest.py", "testutil.py", "nbutil.py"}


def _folders(root: pathlib.Path):
    return [d for d in [root, *sorted(root.rglob("*"))] if d.is_dir() and d.name != "__pycache__"]


def _test_modules():
    """(folder parts relative to tests/, name after ``test_``) of every test module outside the cross-cutting folders."""
    out = []
    for path in sorted(TESTS.rglob("test_*.py")):
        parts = path.relative_to(TESTS).parts[:-1]
        if "__pycache__" in parts or (parts and parts[0] in CROSS_CUTTING):
            continue
        out.append((parts, path.stem[len("test_"):]))
    return out


def _is_package(d: pathlib.Path) -> bool:
    return (d / "__init__.py").is_file()


def _targets(parts, name):
    """The package modules / sub-packages ``tests/<parts>/test_<name>.py`` may test (empty: it maps to nothing)."""
    pkg = PACKAGE.joinpath(*parts)
    if not _is_package(pkg):
        return []
    pieces = name.split("_")
    found = []
    for i in range(len(pieces), 0, -1):  # the whole name first, then its prefixes (test_<name>_<topic>.py)
        stem = "_".join(pieces[:i])
        if (pkg / f"{stem}.py").is_file() and stem != "__init__":
            found.append(pkg / f"{stem}.py")
        if _is_package(pkg / stem):
            found.append(pkg / stem)
        if parts and stem == parts[-1]:
            found.append(pkg)
    return found


def _sub_packages():
    return [d.relative_to(PACKAGE).parts for d in _folders(PACKAGE) if d != PACKAGE and _is_package(d)]


def test_every_test_module_maps_to_a_module_or_sub_package():
    stray = [f"tests/{'/'.join(parts + (f'test_{name}.py',))}" for parts, name in _test_modules()
             if not _targets(parts, name)]
    assert not stray, (
        "test modules that mirror no module or sub-package of jaxrl_reason (name them tests/<path>/"
        f"test_<module>.py, or move cross-cutting ones to {sorted(CROSS_CUTTING)}): {stray}")


def test_every_sub_package_has_a_test_module_in_its_mirrored_folder():
    modules = _test_modules()

    def covered(sub):
        parent, last = sub[:-1], sub[-1]
        return any(parts[:len(sub)] == sub
                   or (parts == parent and (name == last or name.startswith(last + "_")))
                   for parts, name in modules)

    missing = ["/".join(sub) for sub in _sub_packages() if not covered(sub)]
    assert not missing, (
        "sub-packages without a test module (tests/<path>/test_<sub-package>.py or one under "
        f"tests/<path>/<sub-package>/): {missing}")


def test_every_notebook_has_its_test_module_and_no_other_is_there():
    notebooks = {p.stem for p in (REPO / "notebooks").glob("*.ipynb")}
    tested = {p.stem[len("test_"):] for p in (TESTS / "notebooks").glob("test_*.py")}
    assert notebooks - tested == set(), f"notebooks without tests/notebooks/test_<notebook>.py: {sorted(notebooks - tested)}"
    assert tested - notebooks == set(), f"tests/notebooks/ modules named after no notebook: {sorted(tested - notebooks)}"


def test_test_folders_are_packages_and_the_helpers_stay_importable():
    assert not (TESTS / "__init__.py").exists(), (
        "tests/ must not be a package: its conftest.py puts tests/ on sys.path for testutil / nbutil")
    for helper in HELPERS:
        assert (TESTS / helper).is_file(), f"tests/{helper} missing (it must stay at the tests/ root)"
    folders = [d for d in _folders(TESTS)[1:] if any(d.glob("*.py"))]
    not_packages = [str(d.relative_to(TESTS)) for d in folders if not _is_package(d)]
    assert not not_packages, (
        f"test folders without __init__.py (their basenames would clash under pytest's prepend import mode): {not_packages}")
    shadowing = [d.name for d in folders if d.parent == TESTS and d.name in {"jaxrl_reason", "testutil", "nbutil", "conftest"}]
    assert not shadowing, f"top-level test packages shadowing a module the tests import: {shadowing}"
    odd = [str(p.relative_to(TESTS)) for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts
           and not p.name.startswith("test_") and p.name != "__init__.py"
           and not (p.parent == TESTS and p.name in HELPERS) and p.name != "conftest.py"]  # a folder's fixtures
    assert not odd, f"python files in tests/ that are neither test modules nor the known helpers: {odd}"


EXPERIMENTS = PACKAGE / "experiments"
MAX_EXPERIMENT_LINES = 250  # issue 53: an experiment is a config, presets and a run that calls library functions


def _wiring_experiments():
    """The experiments held to "experiments are wiring": all but the benchmarks and the device check."""
    return [p for p in sorted(EXPERIMENTS.glob("*.py"))
            if p.name != "__init__.py" and not p.name.startswith("bench_") and p.name != "device_check.py"]


def test_experiments_are_short_wiring():
    long = {p.name: n for p in _wiring_experiments() if (n := len(p.read_text().splitlines())) > MAX_EXPERIMENT_LINES}
    assert not long, (
        f"experiments over {MAX_EXPERIMENT_LINES} lines (move their logic into the library: rl/, search/, agents/, "
        f"solvers/ ...; docs/design.md's layering): {long}")


def test_experiments_define_no_classes_but_configs():
    """A class in an experiment is a config: a dataclass (``@dataclasses.dataclass``, frozen or not). Models,
    tokenizers, trainers and helpers belong in the library, where they are tested."""
    import ast

    def is_dataclass(node: ast.ClassDef) -> bool:
        for dec in node.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
            if name == "dataclass":
                return True
        return False

    others = [f"{p.name}:{node.lineno} {node.name}" for p in _wiring_experiments()
              for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.ClassDef) and not is_dataclass(node)]
    assert not others, f"classes in experiments that are not configs (dataclasses): {others}"


MAX_CORE_MODULE_LINES = 500  # issue 53: no module over ~500 lines in models/ or rl/ (one job per module)


def test_model_and_rl_modules_are_short():
    long = {str(p.relative_to(PACKAGE)): n for folder in ("models", "rl") for p in sorted((PACKAGE / folder).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_CORE_MODULE_LINES}
    assert not long, f"modules of models/ and rl/ over {MAX_CORE_MODULE_LINES} lines (split them by job): {long}"
