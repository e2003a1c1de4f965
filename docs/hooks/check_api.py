"""After ``mkdocs build``: every public name of lmc's subpackages (their ``__all__``) has an
entry in the API reference (the site's ``objects.inv``). Run by ``.ci/run``::

    python docs/hooks/check_api.py SITE_DIR
"""

from __future__ import annotations

import importlib
import sys
import zlib
from pathlib import Path

PACKAGES = (
    "models data permutation interpolation merging curves metrics pruning tasks studies "
    "population results"
).split()


def inventory(site: Path) -> set[str]:
    """The object names of a Sphinx inventory (version 2) as mkdocstrings writes it."""
    raw = (site / "objects.inv").read_bytes()
    header_end = 0
    for _ in range(4):  # four '#' header lines, then zlib
        header_end = raw.index(b"\n", header_end) + 1
    text = zlib.decompress(raw[header_end:]).decode()
    return {line.split(" ", 1)[0] for line in text.splitlines() if line.strip()}


def missing(site: Path) -> list[str]:
    names = inventory(site)
    out = []
    for package in PACKAGES:
        module = importlib.import_module(f"lmc.{package}")
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            # a function named as its module (lmc.merging.ccmm): documented at its own path
            own = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
            if f"lmc.{package}.{name}" not in names and own not in names:
                out.append(f"lmc.{package}.{name}")
    return out


if __name__ == "__main__":
    site = Path(sys.argv[1] if len(sys.argv) > 1 else "site")
    gaps = missing(site)
    if gaps:
        print(f"{len(gaps)} public names have no API reference entry: {', '.join(gaps)}")
        sys.exit(1)
    print(f"API reference: every public name of {len(PACKAGES)} subpackages has its entry")
