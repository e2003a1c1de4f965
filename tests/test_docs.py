"""The README is the front door (issue 34): short, and every link it has resolves to a page of
the documentation site or a file of the repository; every docs page is in the site's nav."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"(?<!!)\[[^\]]+\]\(([^)\s]+)\)")


def nav_pages(nav) -> set[str]:
    out: set[str] = set()
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        out |= nav_pages(value) if isinstance(value, list) else {value}
    return out


def mkdocs_config() -> dict:
    text = (ROOT / "mkdocs.yml").read_text()
    return yaml.safe_load(text)


def test_the_readme_is_at_most_250_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_every_readme_link_resolves_to_a_site_page_or_a_file():
    pages = nav_pages(mkdocs_config()["nav"])
    text = (ROOT / "README.md").read_text()
    links = [m for m in LINK.findall(text) if not m.startswith("http")]
    assert links
    for link in links:
        path, _, anchor = link.partition("#")
        assert (ROOT / path).exists(), f"README links to {link}, which does not exist"
        if path.startswith("docs/") and path.endswith(".md"):
            page = path.removeprefix("docs/")
            assert page in pages, f"README links to {link}, a page not in mkdocs.yml's nav"
            if anchor:
                headings = (ROOT / path).read_text()
                slugs = {_slug(h) for h in re.findall(r"^#+ (.+)$", headings, flags=re.M)}
                assert anchor in slugs, f"README links to {link}: no such heading there"


def test_every_docs_page_is_in_the_nav():
    pages = nav_pages(mkdocs_config()["nav"])
    docs = ROOT / "docs"
    on_disk = {
        str(p.relative_to(docs)) for p in [*docs.rglob("*.md"), *docs.glob("tutorials/*.py")]
    }
    assert on_disk == pages


def test_the_tutorial_runs_and_shows_matching_and_merging_at_work(monkeypatch, capsys):
    """The notebook as a script (the docs build executes it too): matching removes most of the
    barrier, and the aligned merges beat plain averaging."""
    import runpy

    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.setattr("matplotlib.pyplot.show", lambda *a, **k: None)
    runpy.run_path(str(ROOT / "docs" / "tutorials" / "python-api.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "same function after permuting: True" in out
    barrier = {
        line.split()[0]: float(line.split()[-1])
        for line in out.splitlines()
        if "loss barrier" in line
    }
    assert barrier["matched"] < 0.5 * barrier["naive"]
    acc = {
        line.split()[0]: float(line.split()[-1])
        for line in out.splitlines()
        if "merged model" in line
    }
    assert acc["mergemany"] > acc["naive"] and acc["stemm"] > acc["naive"]


def _slug(heading: str) -> str:
    """Python-Markdown's toc slug: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"[\s]+", "-", text)
