"""A griffe extension for the API reference (mkdocs.yml loads it; the site does not ship it).

tandem's docstrings are written for Sphinx: ``:class:`~tandem.share.Consumer```-style
roles and ``::`` before a literal block. mkdocstrings renders Markdown, where those show as
stray colons. Here each role becomes a code span (``~a.b.C`` -> ``C``, as Sphinx shows it)
and a paragraph's closing ``::`` a single colon (the indented block after it is a code block
in Markdown too). The source is left as it is.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?[a-z]+:`([^`]+)`")
TITLED = re.compile(r"^(.*?)\s*<[^>]+>$")  # :role:`title <target>`


def _role(match: re.Match[str]) -> str:
    target = match.group(1).strip()
    titled = TITLED.match(target)
    if titled:
        target = titled.group(1)
    elif target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target.lstrip('!')}`"


def markdown(text: str) -> str:
    """A docstring's reST roles and literal-block markers as Markdown."""
    text = ROLE.sub(_role, text)
    lines = []
    for line in text.split("\n"):
        if line.strip() == "::":
            continue  # a marker alone on its line: the block that follows is indented already
        if line.endswith("::"):
            line = line[:-1]
        lines.append(line)
    return "\n".join(lines)


class RstRoles(griffe.Extension):
    """Rewrite every docstring once the object tree is built."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
