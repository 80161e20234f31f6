"""The README and the documentation site stay true.

The site (``docs/``, ``mkdocs.yml``) builds with ``--strict``, so a broken link or anchor, a
page missing from the nav or a bad docstring reference fails here; its CLI page is the CLI's
help (generated at build time) and its API page lists every public name. The README stays
short, its links resolve, and every test it or a page cites exists.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import wids
from wids.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        cwd=config.parent,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    r = _build(ROOT / "mkdocs.yml", out)
    assert r.returncode == 0, r.stderr[-4000:]
    return out


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    progs = [parser.prog]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                progs += _commands(sub)
    return progs


def test_the_cli_page_is_the_help_of_every_command(site: Path) -> None:
    html = (site / "cli" / "index.html").read_text()
    progs = _commands(build_parser())
    assert len(progs) >= 10 and "wids index create" in progs
    for prog in progs:
        assert f"usage: {prog} " in html, prog


def test_the_api_page_documents_every_public_name(site: Path) -> None:
    listed = re.findall(r"^::: wids\.(\w+)$", (ROOT / "docs" / "api.md").read_text(), re.M)
    missing, extra = set(wids.__all__) - set(listed), set(listed) - set(wids.__all__)
    assert not missing and not extra, (
        f"docs/api.md must list wids.__all__: add {missing}, drop {extra}"
    )
    assert len(listed) == len(set(listed))
    html = (site / "api" / "index.html").read_text()
    for name in wids.__all__:
        assert f'id="wids.{name}"' in html, name  # rendered from the docstrings


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    """The check above can fail: the same site with one dead link does not build."""
    for name in ("mkdocs.yml", "DEVELOPERS.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    for folder in ("docs", "tools", "wids"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__py*"))
    page = tmp_path / "docs" / "cache.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    r = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert r.returncode != 0 and "no-such-page.md" in r.stderr


def _slug(heading: str) -> str:
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    return re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", text))


def test_the_readme_is_short_and_its_links_resolve() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 120
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert len(links) > 10
    for link in links:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), link
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(), re.M)
            assert anchor in {_slug(h) for h in headings}, link


def test_the_readme_commands_are_the_scripts_ci_runs() -> None:
    text = README.read_text()
    block = re.search(r"## The demo and the tests.*?```bash\n(.*?)```", text, re.S)
    assert block is not None
    commands = [ln.split("#")[0].strip() for ln in block.group(1).splitlines()]
    assert commands == ["bash tools/demo.sh", "bash tools/test.sh"]
    assert "tools/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_cited_tests_exist() -> None:
    """Every ``tests/FILE.py::name`` (and following ``::name``) the README or a page cites."""
    cited: list[tuple[str, str]] = []
    for doc in [README, *PAGES]:
        current = ""
        pattern = r"`(tests/[\w/]+\.py)((?:::[\w\[\]*-]+)?)`|`::([\w\[\]*-]+)`"
        for m in re.finditer(pattern, doc.read_text()):
            if m.group(1):
                current = m.group(1)
                assert (ROOT / current).is_file(), f"{doc.name}: {current}"
                if m.group(2):
                    cited.append((current, m.group(2)[2:]))
            else:
                assert current, f"{doc.name}: ::{m.group(3)} follows no test file"
                cited.append((current, m.group(3)))
    assert len(cited) > 10
    for path, name in cited:
        source = (ROOT / path).read_text()
        stem = name.split("[")[0].rstrip("*")
        assert re.search(rf"^\s*(?:async )?def {re.escape(stem)}", source, re.M), f"{path}::{name}"


@pytest.mark.slow
def test_the_readme_quickstart_runs_as_written(tmp_path: Path) -> None:
    """The README's quickstart, commands and code unchanged, on 32 small shards of real JPEGs."""
    pytest.importorskip("torch")
    from wids.synth import write_dataset

    write_dataset(
        str(tmp_path / "data"), shards=32, samples_per_shard=4, image_size=16, prefix="train"
    )
    section = README.read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    shell, code = re.findall(r"```(?:bash|python)\n(.*?)```", section, re.S)
    commands = [ln.split("  #")[0] for ln in shell.splitlines() if ln.strip()]
    assert [c.split()[:2] for c in commands] == [["wids", "index"], ["wids", "show"]]
    for command in commands:
        argv = [sys.executable, "-m", "wids", *shlex.split(command)[1:]]
        r = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (command, r.stderr[-2000:])
    assert "    7  000001000003  " in r.stdout  # `wids show -n 8`: the 8th sample's row
    # ds[123] is shard 30's fourth sample; the last batch of the last epoch is a full one
    script = code + '\nprint("RESULT", tuple(images.shape), len(ds), s["__key__"])\n'
    r = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    result = r.stdout.split("RESULT", 1)[1].split()
    assert result == ["(64,", "3,", "16,", "16)", "128", "000030000003"]


def test_the_pages_read_samples_blocks_run_as_written(tmp_path: Path) -> None:
    """The quickstart's commands (making its data, indexing it) and the quickstart's and the
    dataset page's first block, pasted as they are: each value is of the type its comment says."""
    page = (ROOT / "docs" / "quickstart.md").read_text()
    make = re.findall(r"`(python -c \"from wids\.synth[^`]*)`", page)
    index = re.findall(r"```bash\n(wids index create [^\n#]*)", page)
    assert len(make) == 1 and len(index) == 1
    for command in (make[0], index[0]):
        argv = shlex.split(command)
        argv = [sys.executable, *argv[1:]] if argv[0] == "python" else [sys.executable, "-m", *argv]
        r = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (command, r.stderr[-2000:])
    check = (
        "\nfrom PIL.Image import Image\n"
        "assert isinstance(s['__key__'], str) and isinstance(s['.jpg'], Image)\n"
        "assert type(s['.cls']) is int and len(ds) == 128 and s['__index__'] == 123\n"
        "assert ds[-1]['__key__'] == '000031000003'\n"
        "print('OK')\n"
    )
    for name in ("quickstart.md", "dataset.md"):
        block = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / name).read_text(), re.S)[0]
        assert block.startswith("from wids import ShardListDataset\n"), name
        r = subprocess.run(
            [sys.executable, "-c", block + check],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0 and r.stdout.split()[-1] == "OK", (name, r.stderr[-2000:])
