"""The command line of a Python module tandem starts (``python -m MODULE``) that never
imports from the directory it starts in.

``python -m`` puts the current directory first on ``sys.path``: a ``tandem/`` (or ``ray/``)
folder in the directory a job was submitted from would be imported in place of tandem's
own, with the user's rights, by the job's supervisor. ``-P`` (Python 3.11+, "safe path")
prepends nothing and changes nothing else (the environment and ``PYTHONPATH`` are kept;
unlike ``PYTHONSAFEPATH``, it is not passed on to the job). An interpreter that may not have
``-P`` (another one's, or 3.10) gets the same from a line of bootstrap that drops the
current directory before it imports anything but ``sys``. The module's name stays an
argument of its own on the command line, where tandem finds its processes by it.
"""

from __future__ import annotations

import sys

# ``python -c`` puts "" (the current directory) first: dropped before runpy is imported.
_BOOTSTRAP = (
    "import sys\n"
    "if sys.path and sys.path[0] == '': del sys.path[0]\n"
    "import runpy\n"
    "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"
)


def module_command(module: str, *args: str, python: str | None = None) -> list[str]:
    """``python -m module args...`` for ``python`` (default: this interpreter), with nothing
    of the current directory on its import path."""
    if python is None or python == sys.executable:
        if sys.version_info >= (3, 11):
            return [sys.executable, "-P", "-m", module, *args]
        python = sys.executable
    return [python, "-c", _BOOTSTRAP, module, *args]
