"""``python -m lmc`` is the ``lmc`` command."""

from lmc.cli import main

main()
