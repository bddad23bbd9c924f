"""``python -m tandem.cli``: the ``tandem`` command."""

from tandem.cli import main

main()
