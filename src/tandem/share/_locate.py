"""A ``MODULE:FUNCTION`` reference confirmed from its source, without running the module.

``tandem share define`` checks the reference its producer will import. Importing the
user's module to do so (torch and the dataset's own imports) cost 3.7 CPU-s on a 2-core
machine, in a command whose sweep then imports it again in the producer: a tenth of the
manager's own CPU on an 8-trial sweep. So the module's source is read instead, found where
the import system would find it: a top-level ``def NAME`` (or ``class NAME`` with its own
``__init__``) that can be called with no arguments and that nothing else at the top level
binds again is confirmed at once. Anything the source cannot settle (the name assigned,
imported, decorated or missing; a module that is compiled, zipped or found by an installer's
import hook) is answered "don't know", and the caller imports the module as before, which
also gives every error the import's own words.

Confirmed here is the reference, not the module's import: an error in the module's own
imports is met when its producer starts (and fails its group's jobs with it).
"""

from __future__ import annotations

import ast
import importlib.machinery
import os
import sys
from pathlib import Path


def confirmed(ref: str) -> bool:
    """Whether ``ref`` (``MODULE:NAME`` or ``path/to/file.py:NAME``) names, as its module's
    source says, a function or class that can be called with no arguments. False: not
    settled here (import it to know)."""
    module, sep, name = ref.partition(":")
    if not sep or not module or not name.isidentifier():
        return False
    source = _source_file(module)
    if source is None:
        return False
    try:
        tree = ast.parse(source.read_bytes(), filename=str(source))
    except (OSError, SyntaxError, ValueError):
        return False
    return _callable_without_arguments(tree, name)


def _source_file(module: str) -> Path | None:
    """The ``.py`` file the import system would run for ``module`` (a path, or a dotted name
    looked up on ``sys.path`` and the working directory, as :func:`~tandem.share.spec.
    load_object` imports it), found without running any package's ``__init__``."""
    if module.endswith(".py") or "/" in module:
        path = Path(module)
        return path if path.suffix == ".py" and path.is_file() else None
    search = [os.getcwd(), *sys.path]
    parts = module.split(".")
    spec = None
    for i in range(len(parts)):
        if spec is not None:
            search = list(spec.submodule_search_locations or [])
            if not search:
                return None
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), search)
        if spec is None:  # a builtin, an import hook's (editable installs), or not there
            return None
    if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
        return None
    return Path(spec.origin) if spec.origin else None


def _callable_without_arguments(tree: ast.Module, name: str) -> bool:
    statements = _top_level(tree)
    bindings = [_bound(node) for node in statements]
    found = [node for node, names in zip(statements, bindings) if name in names]
    if len(found) != 1 or any("*" in names for names in bindings):
        return False  # absent, bound again (assigned, imported, redefined, deleted) or unknown
    if any(isinstance(n, ast.Global) and name in n.names for n in ast.walk(tree)):
        return False  # a function rebinds it when called
    node = found[0]
    if isinstance(node, ast.FunctionDef) and not node.decorator_list:
        return _no_required(node.args, skip=0)
    if isinstance(node, ast.ClassDef) and not node.decorator_list and not node.keywords:
        init = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
        new = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__new__"]
        if len(init) == 1 and not init[0].decorator_list and not new:
            return _no_required(init[0].args, skip=1)  # self
    return False


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    """The statements run at import, through if/try/with/for/while blocks, not into
    function or class bodies."""
    out: list[ast.stmt] = []
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        out.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                todo += [n for n in getattr(node, field, []) if isinstance(n, ast.stmt)]
            for handler in getattr(node, "handlers", []):
                todo += handler.body
    return out


def _bound(node: ast.stmt) -> set[str]:
    """The names statement ``node`` binds (or unbinds) at the module's top level; ``*`` for
    a star import (any name) and for what cannot be followed (``global``, ``exec``)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {"*" if a.name == "*" else (a.asname or a.name).split(".")[0] for a in node.names}
    names: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
            names.add(sub.id)
        elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id in _DYNAMIC:
            names.add("*")
    return names


# Calls at the top level that may bind any name: the reference is then not settled here.
_DYNAMIC = {"exec", "globals", "setattr", "vars", "__import__"}


def _no_required(args: ast.arguments, skip: int) -> bool:
    """Whether a call with no arguments binds every parameter (``skip``: ``self``)."""
    positional = [*args.posonlyargs, *args.args][skip:]
    required = len(positional) - len(args.defaults)
    kw_required = [a for a, default in zip(args.kwonlyargs, args.kw_defaults) if default is None]
    return required <= 0 and not kw_required
