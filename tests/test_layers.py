"""The house's floors (issue 32): the command line on top of the studies on top of the engine
on top of populations and everything else; no module imports a floor above its own, inside a
function or not, so there is no import circle through them."""

from __future__ import annotations

import ast
from pathlib import Path

import lmc

ROOT = Path(lmc.__file__).parent
#: a package's (or a module's) floor; every other package of lmc is on floor 0. The Lightning
#: seam (lmc.engine.seam) imports Lightning alone, so every floor may use it.
FLOORS = {
    "cli": 4,
    "__main__": 4,
    "studies": 3,
    "engine": 2,
    "engine.seam": 0,
    "population": 1,
}


def _floor(module: str) -> int:
    parts = module.split(".")
    if len(parts) < 2:
        return 0
    return FLOORS.get(".".join(parts[1:3]), FLOORS.get(parts[1], 0))


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every ``lmc`` import in ``path``, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("lmc")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "lmc":  # from lmc import cli
                found += [(node.lineno, f"lmc.{a.name}") for a in node.names]
            elif node.module.startswith("lmc."):
                found.append((node.lineno, node.module))
    return found


def test_no_module_imports_a_floor_above_its_own():
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        module = "lmc." + ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for line, imported in _imports(path):
            if _floor(imported) > _floor(module):
                wrong.append(f"{path.relative_to(ROOT.parent)}:{line} imports {imported}")
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_a_violation(tmp_path):
    """The scan finds imports inside functions, as the old ones from the studies were."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from lmc.cli import main\n    import lmc.studies.running.run\n")
    assert _imports(bad) == [(2, "lmc.cli"), (3, "lmc.studies.running.run")]
    assert _floor("lmc.cli") > _floor("lmc.studies.running.run") > _floor("lmc.engine.app")
    assert _floor("lmc.engine.seam") == _floor("lmc.tasks.base") == 0


#: the widest constructor allowed (issue 32): more options go into an option group
MAX_PARAMETERS = 12


def _wide_constructors(root: Path) -> list[str]:
    wide = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                a = node.args
                n = len(a.posonlyargs) + len(a.args) - 1 + len(a.kwonlyargs)  # less self
                if n > MAX_PARAMETERS:
                    wide.append(f"{path.relative_to(root.parent)}:{node.lineno} ({n})")
    return wide


def test_no_constructor_takes_more_than_twelve_parameters(tmp_path):
    assert _wide_constructors(ROOT) == []
    wide = "class A:\n    def __init__(self, " + ", ".join(f"a{i}" for i in range(13)) + "): ...\n"
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "wide.py").write_text(wide)
    assert _wide_constructors(tmp_path / "pkg") == ["pkg/wide.py:2 (13)"]


def test_every_task_is_on_the_lmc_base():
    """Every LightningModule task of lmc.tasks derives from lmc.tasks.base.LMCTask."""
    import inspect

    import lightning as L

    import lmc.tasks as tasks
    from lmc.tasks.base import LMCTask

    found = [
        c for _, c in inspect.getmembers(tasks, inspect.isclass) if issubclass(c, L.LightningModule)
    ]
    assert found and [c.__name__ for c in found if not issubclass(c, LMCTask)] == []


def test_the_models_import_nothing_of_lmc_but_the_models():
    """Architectures and their initialisers are leaves (issue 49: an MLP imported its
    initialiser from lmc.metrics)."""
    wrong = [
        f"{path.relative_to(ROOT.parent)}:{line} imports {imported}"
        for path in sorted((ROOT / "models").rglob("*.py"))
        for line, imported in _imports(path)
        if not imported.startswith("lmc.models")
    ]
    assert not wrong, "\n".join(wrong)
