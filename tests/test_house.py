"""The shape of the house, checked on every commit: imports go one way between tandem's
packages (every import counted, lazy ones inside functions too), no class name is defined
twice in a package, a job's state is written by the
state module alone, share definitions by the daemon alone, and benchmarks import no tests."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "tandem"


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path) -> set[str]:
    """Every tandem module ``name`` imports, wherever the import statement is."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found |= {module} | {f"{module}.{a.name}" for a in node.names}
    return {m for m in found if m == "tandem" or m.startswith("tandem.")}


def _package(module: str, packages: set[str]) -> str:
    """The innermost package of ``module`` among ``packages`` (a top-level module is its own)."""
    while module not in packages and "." in module:
        module = module.rpartition(".")[0]
    return module


def _graph(depth: int) -> dict[str, set[str]]:
    """Edges between packages at most ``depth`` levels below tandem (``tandem.place``: 1,
    ``tandem.place.run``: 2; a module directly in ``tandem`` counts as a package of its own).
    A subpackage and the package it is in are one room: edges between them are not counted."""
    modules = _modules()
    names = {m for m, p in modules.items() if p.name == "__init__.py" and 0 < m.count(".") <= depth}
    names |= {m for m in modules if m.count(".") == 1}
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        here = _package(name, names)
        for target in _imports(name, path):
            there = _package(target, names)
            if (
                there in names
                and not (here + ".").startswith(there + ".")
                and not there.startswith(here + ".")
            ):
                edges[here].add(there)
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return None
        for nxt in sorted(edges.get(node, ())):
            found = visit(nxt, path + [node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(edges):
        found = visit(start, [])
        if found:
            return found
    return None


def test_every_folder_of_modules_is_a_package() -> None:
    """A folder without ``__init__.py`` is left out of a wheel (setuptools finds packages)."""
    loose = [str(d.relative_to(ROOT)) for d in SRC.rglob("*") if d.is_dir() and any(d.glob("*.py"))
             and not (d / "__init__.py").exists()]  # fmt: skip
    assert not loose, loose


@pytest.mark.parametrize("depth", [1, 2])
def test_no_import_cycle_between_packages_lazy_imports_included(depth: int) -> None:
    cycle = _cycle(_graph(depth))
    assert cycle is None, "an import cycle: " + " -> ".join(cycle or [])


def _doors(path: Path) -> tuple[str, ...] | None:
    """What a package may import outside itself, from the ``Doors:`` paragraph of its
    ``__init__`` docstring (modules or packages, comma-separated); None where it has none."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    found = re.search(r"^Doors:(.*?)(?:\n\s*\n|\Z)", doc, re.M | re.S)
    if found is None:
        return None
    return tuple(d.strip().rstrip(".") for d in found.group(1).replace("\n", " ").split(",") if d.strip())


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_each_of_runs_processes_is_a_subpackage_that_declares_its_doors() -> None:
    modules = _modules()
    run = [m for m, p in modules.items() if _inside(m, "tandem.place.run") and p.name == "__init__.py"]
    assert {m.rpartition(".")[2] for m in run if m != "tandem.place.run"} == {
        "supervisor", "launchers", "metrics", "services",
    }  # fmt: skip
    loose = [
        m
        for m, p in modules.items()
        if m.rpartition(".")[0] == "tandem.place.run" and p.name != "__init__.py"
    ]
    assert not loose, f"a module of run/ outside its process's subpackage: {loose}"
    undeclared = [m for m in run if _doors(modules[m]) is None]
    assert not undeclared, f"no Doors: paragraph in the docstring of {undeclared}"


def test_no_import_goes_around_a_packages_declared_doors() -> None:
    """A module of a package with a ``Doors:`` paragraph (the innermost such package it is in)
    imports only its own package and those doors (lazy imports and imports for types too);
    a supervisor, say, never reaches the daemon, its client or its decisions."""
    modules = _modules()
    declared = {m: d for m, p in modules.items() if p.name == "__init__.py" and (d := _doors(p)) is not None}
    unknown = [f"{m}: {d}" for m, ds in declared.items() for d in ds if d not in modules]
    assert not unknown, f"a door that is no module: {unknown}"
    around = []
    for name, path in modules.items():
        owners = [p for p in declared if _inside(name, p)]
        if not owners:
            continue
        owner = max(owners, key=len)
        doors = declared[owner]
        for target in sorted(_imports(name, path)):
            if (
                _inside(target, owner)
                or any(_inside(target, d) for d in doors)
                or any(_inside(d, target) for d in doors)  # a package on the way to a door
            ):
                continue
            around.append(f"{name} imports {target} (doors of {owner}: {', '.join(doors)})")
    assert not around, "\n".join(around)


def _face_for_type_checkers() -> dict[str, str]:
    """The names ``tandem.place`` gives type checkers (its ``if TYPE_CHECKING:`` imports), as
    its ``_FACE`` writes them: name -> ``MODULE:ATTRIBUTE`` or ``MODULE``, below tandem.place."""
    modules = _modules()
    tree = ast.parse((SRC / "place" / "__init__.py").read_text())
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    out = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.module, ast.unparse(node)
        module = node.module.removeprefix("tandem.place").removeprefix(".")
        for a in node.names:
            if f"{node.module}.{a.name}" not in modules:
                out[a.asname or a.name] = f"{module}:{a.name}"
            else:  # a module
                out[a.asname or a.name] = f"{module}.{a.name}".lstrip(".")
    return out


def test_the_manager_s_face_names_each_export_once_for_runtime_and_type_checkers() -> None:
    import subprocess
    import sys

    import tandem.place

    assert _face_for_type_checkers() == tandem.place._FACE
    for name in tandem.place._FACE:
        assert getattr(tandem.place, name) is not None, name
    # Importing the face imports none of the manager: the CLI starts fast.
    code = "import sys, tandem.place; print(sorted(m for m in sys.modules if m.startswith('tandem.place.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_the_other_packages_use_the_manager_through_its_face_only() -> None:
    """The CLI, the dashboard, ``tandem.jobs``, ``tandem.select`` and the rest import
    ``tandem.place`` and its face's names, never one of its modules (lazy imports too)."""
    import tandem.place

    modules = _modules()
    around = []
    for name, path in modules.items():
        if _inside(name, "tandem.place"):
            continue
        for target in sorted(_imports(name, path)):
            if not _inside(target, "tandem.place") or target == "tandem.place":
                continue
            if (
                target.rpartition(".")[0] == "tandem.place"
                and target.rpartition(".")[2] in tandem.place._FACE
            ):
                continue
            around.append(f"{name} imports {target}")
    assert not around, "\n".join(around)


def test_request_handlers_do_not_import_the_daemon() -> None:
    """A handler returns what it changed and the daemon sets its own flags: requests.py
    reaches none of the daemon (no import, lazy or for types)."""
    imports = _imports("tandem.place.requests", SRC / "place" / "requests.py")
    assert not {m for m in imports if m.startswith("tandem.place.daemon")}, imports


def test_share_imports_neither_select_nor_place_nor_watch() -> None:
    edges = _graph(1)
    assert not edges["tandem.share"] & {"tandem.select", "tandem.place", "tandem.watch"}, edges[
        "tandem.share"
    ]


def test_share_statistics_are_read_without_torch() -> None:
    """watch reads share's statistics through tandem.share.stats, which pulls in no torch."""
    import subprocess
    import sys

    code = "import sys, tandem.watch.samplers.share; print('torch' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_a_stored_selection_is_read_without_torch() -> None:
    """The dashboard's group page and ``select report`` read stored selections: importing
    torch for that cost a group page 3-10 s (it timed out under CI's load)."""
    import subprocess
    import sys

    code = (
        "import sys, tandem.select, tandem.select.report, tandem.web.data; tandem.select.load; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"]


def test_no_class_name_defined_twice_in_a_package() -> None:
    where: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in SRC.rglob("*.py"):
        package = path.relative_to(SRC).parts[0] if len(path.relative_to(SRC).parts) > 1 else "tandem"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where[(package, node.name)].append(str(path.relative_to(ROOT)))
    twice = {k: v for k, v in where.items() if len(v) > 1}
    assert not twice, twice


_DECLARING_BASES = {"NamedTuple", "Protocol", "TypedDict", "ABC"}


def test_no_class_declares_attributes_that_only_another_class_sets() -> None:
    """A class is never cut in two: attributes declared bare in a class body (``name: str``,
    no value) are fields only where something makes them so (a dataclass, a NamedTuple, a
    TypedDict), an interface (a Protocol) or an abstract base (ABC) that its implementations
    fill; elsewhere each attribute is set by the class's own constructor (issue 48: the
    constructor-less halves of the consumer and the producer)."""
    halves = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            bare = [
                ast.unparse(item.target)
                for item in node.body
                if isinstance(item, ast.AnnAssign) and item.value is None
            ]
            decorators = " ".join(ast.unparse(d) for d in node.decorator_list)
            bases = {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}
            if bare and "dataclass" not in decorators and not bases & _DECLARING_BASES:
                halves.append(f"{path.relative_to(ROOT)}: {node.name} declares {', '.join(bare)}")
    assert not halves, halves


def test_only_the_state_module_writes_a_jobs_state() -> None:
    """No module but the state module (place/state.py, with its migrations in place/schema.py)
    writes the jobs table: no SQL that updates jobs or inserts into it, no transition's inner
    writer, no update_job(state=...)."""
    state_module = (SRC / "place" / "state.py", SRC / "place" / "schema.py")
    sql = re.compile(r"(UPDATE|INSERT\s+INTO|REPLACE\s+INTO)\s+[\"']?jobs\b", re.IGNORECASE)
    writers = []
    for path in SRC.rglob("*.py"):
        if path in state_module:
            continue
        text = path.read_text()
        if sql.search(text) or "._move(" in text or re.search(r"update_job\([^)]*[\"']?\bstate\b", text):
            writers.append(str(path.relative_to(ROOT)))
    assert not writers, f"modules that write jobs: {writers}"


def test_share_definitions_are_written_by_the_daemon_alone() -> None:
    """Only the daemon's request handlers define or remove a share (the CLI asks it); only
    the state module holds SQL that adds or deletes a share's row."""
    handlers, state_module = (
        SRC / "place" / "requests.py",
        (SRC / "place" / "state.py", SRC / "place" / "schema.py"),
    )
    sql = re.compile(r"(INSERT\s+INTO|DELETE\s+FROM|REPLACE\s+INTO)\s+[\"']?shares\b", re.IGNORECASE)
    callers = []
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        calls = re.search(r"\.(define_share|remove_share)\(", text)
        if (calls and path not in (handlers, *state_module)) or (
            sql.search(text) and path not in state_module
        ):
            callers.append(str(path.relative_to(ROOT)))
    assert not callers, callers


def test_benchmarks_import_no_test_code() -> None:
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks").rglob("*.py")
                 if re.search(r"^\s*(from|import)\s+tests\b", p.read_text(), re.MULTILINE)]  # fmt: skip
    assert not offenders, offenders


def _module_edges() -> dict[str, set[str]]:
    """Module -> the tandem modules it imports (lazy ones too), each import resolved to the
    module it names (``from tandem.place import state`` is ``tandem.place.state``)."""
    modules = _modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for target in _imports(name, path):
            while target not in modules and "." in target:
                target = target.rpartition(".")[0]
            if target in modules and target != name:
                edges[name].add(target)
    return edges


def test_no_import_cycle_between_modules_lazy_imports_included() -> None:
    """No module imports, at any time, one that imports it back (through any others): a lazy
    import hides a cycle from the interpreter, not from a reader. A package's ``__init__``
    counts as a module; its submodules' imports of it are not counted (Python imports a
    package before its modules, so that edge is always there)."""
    edges = _module_edges()
    for name in list(edges):
        edges[name] = {t for t in edges[name] if not name.startswith(t + ".")}
    cycle = _cycle(edges)
    assert cycle is None, "a module cycle: " + " -> ".join(cycle or [])


def test_no_module_imports_another_packages_private_module() -> None:
    """A private module (``_name``) is imported only from within its own package."""
    found, modules = [], _modules()
    for name, path in modules.items():
        for target in _imports(name, path) & set(modules):
            parts = target.split(".")
            private = next(
                (i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")), None
            )
            if private is None or private < 2:  # tandem._ipc and the like are the house's own
                continue
            owner = ".".join(parts[:private])
            if not (name + ".").startswith(owner + "."):
                found.append(f"{name} imports {target}")
    assert not found, found
