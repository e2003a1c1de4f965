"""``python -m lmc.data ROOT [...]``: write tiny fake datasets (see :func:`lmc.data.fake.main`)."""

from lmc.data.fake import main

main()
