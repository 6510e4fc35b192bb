"""The documentation: the site builds with mkdocs --strict (a broken link or anchor fails it), and
the README stays a front door."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO


def build(folder, site):
    """`mkdocs build --strict` of the mkdocs.yml in folder (without Material's banner about its successor)."""
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=folder,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_strict_with_every_page_in_the_nav(tmp_path):
    """mkdocs.yml sets link and anchor validation to warn, so --strict turns each into a failure; a
    page under docs/ left out of the nav is one too (omitted_files)."""
    done = build(REPO, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "serving" / "index.html").is_file()


def test_a_broken_link_fails_the_strict_build(tmp_path):
    """The check above would pass on a config that validates nothing: a copy of the docs with a
    link to a missing anchor and a page left out of the nav must fail, naming both."""
    docs = tmp_path / "docs"
    subprocess.run(["cp", "-r", str(REPO / "docs"), str(docs)], check=True)
    (docs / "index.md").write_text((docs / "index.md").read_text() + "\n[gone](serving.md#no-such-heading)\n")
    (docs / "forgotten.md").write_text("# Not in the nav\n")
    config = (REPO / "mkdocs.yml").read_text()
    (tmp_path / "mkdocs.yml").write_text(config)
    done = build(tmp_path, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-heading" in done.stderr and "forgotten.md" in done.stderr


def test_the_readme_is_a_front_door():
    assert len((REPO / "README.md").read_text()) < 10_000
