"""The documents lead somewhere real: every relative link in README.md, ARCHITECTURE.md,
bench/README.md and docs/ reaches a file in the repository (and a ``#anchor`` a heading there),
every module the README's behaviour map names exists, and every ``python -m bench.X`` the
documents name is a bench. Modules move; this is what notices the map went stale.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = (
    "README.md",
    "ARCHITECTURE.md",
    "bench/README.md",
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")),
)
MAP_HEADING = "## Where each behaviour lives"

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
CODE_SPAN_PATH = re.compile(r"`([\w./-]+/[\w./-]*)`")
BENCH_COMMAND = re.compile(r"python -m bench\.(\w+)")
# A path in code that reads as a document's or one outside the checkout: `../x`, `y.md`.
NAMED_DOCUMENT = re.compile(r"`((?:\.\./)[^`\s]+|[^`\s]+\.md)`")


def prose(text: str) -> str:
    """The text without fenced blocks, where a ``#`` is a comment and ``[x](y)`` is code."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    words = re.sub(r"[^\w\- ]", "", heading.lower())
    return words.replace(" ", "-")


def anchors(text: str) -> set[str]:
    found: set[str] = set()
    for heading in HEADING.findall(prose(text)):
        anchor = base = slug(heading)
        n = 0
        while anchor in found:  # a repeated heading gets -1, -2, … as on GitHub
            n += 1
            anchor = f"{base}-{n}"
        found.add(anchor)
    return found


def broken_links(text: str, where: Path) -> list[str]:
    """Each relative link in ``text`` (a document at ``where``) that leads nowhere, and why;
    a document or a parent directory named in code counts as a link."""
    problems = []
    named = NAMED_DOCUMENT.findall(prose(text))
    for target in LINK.findall(INLINE_CODE.sub("", prose(text))) + named:
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        path_part, _, anchor = target.partition("#")
        path = (where.parent / path_part).resolve()
        if not path.is_relative_to(REPO):
            problems.append(f"{target}: outside the repository")
        elif path_part and not path.exists():
            problems.append(f"{target}: no such file")
        elif anchor and (not path_part or path.suffix == ".md"):
            headings = anchors(path.read_text() if path_part else text)
            if anchor not in headings:
                shown = path.relative_to(REPO) if path_part else where.name
                problems.append(f"{target}: no heading #{anchor} in {shown}")
    return problems


def behaviour_map(readme: str) -> list[str]:
    """The paths the behaviour map names, in its code spans."""
    start = readme.index(MAP_HEADING)
    end = readme.find("\n## ", start + len(MAP_HEADING))
    section = readme[start : end if end != -1 else None]
    return CODE_SPAN_PATH.findall(section)


def missing(paths: list[str]) -> list[str]:
    return [p for p in paths if not (REPO / p).exists()]


def unknown_benches(text: str) -> list[str]:
    named = set(BENCH_COMMAND.findall(text))
    return sorted(name for name in named if not (REPO / "bench" / f"{name}.py").is_file())


@pytest.mark.parametrize("doc", DOCS)
def test_every_relative_link_resolves(doc):
    path = REPO / doc
    assert LINK.search(path.read_text()), f"{doc} has no links: the check would pass vacuously"
    assert broken_links(path.read_text(), path) == []


def test_every_module_the_behaviour_map_names_exists():
    paths = behaviour_map((REPO / "README.md").read_text())
    assert len(paths) >= 20, "the behaviour map is gone or no longer names modules"
    assert missing(paths) == []


@pytest.mark.parametrize("doc", DOCS)
def test_every_bench_the_docs_name_is_a_module_of_bench(doc):
    assert unknown_benches((REPO / doc).read_text()) == []


def test_bench_readme_lists_every_bench():
    benches = {
        path.stem
        for path in (REPO / "bench").glob("*.py")
        if 'if __name__ == "__main__":' in path.read_text()
    }
    listed = set(BENCH_COMMAND.findall((REPO / "bench" / "README.md").read_text()))
    assert benches - listed == set()


# The checks themselves: each must catch what it is there for.

PLANTED = """# Title

## A section

[fine](README.md), [fine too](#a-section), [here](bench/README.md#the-benches),
[gone](README.mdx), [no heading](ARCHITECTURE.md#no-such-heading),
[up and out](../shared/DESIGN.md), [missing here](#limits), [web](https://example.org/x).
Architecture: `../shared/DESIGN.md`; the benches: `bench/README.md`; see `NOTES.md`.

```sh
[not a link](inside-a-fence.md)   # nor a heading
```

`[not a link either](inside-code.md)`; `python -m bench.placement`, `python -m bench.nonesuch`.
"""


def test_a_planted_broken_link_is_caught():
    assert broken_links(PLANTED, REPO / "PLANTED.md") == [
        "README.mdx: no such file",
        "ARCHITECTURE.md#no-such-heading: no heading #no-such-heading in ARCHITECTURE.md",
        "../shared/DESIGN.md: outside the repository",
        "#limits: no heading #limits in PLANTED.md",
        "../shared/DESIGN.md: outside the repository",
        "NOTES.md: no such file",
    ]


def test_a_planted_unknown_bench_is_caught():
    assert unknown_benches(PLANTED) == ["nonesuch"]


def test_a_planted_stale_module_in_the_map_is_caught():
    readme = (
        f"{MAP_HEADING}\n\n| placement | `placement/scheduler.py`, `placement/gone.py` |\n\n"
        "## Next\n\n`not/in/the/map.py`\n"
    )
    assert behaviour_map(readme) == ["placement/scheduler.py", "placement/gone.py"]
    assert missing(behaviour_map(readme)) == ["placement/gone.py"]


def test_anchors_are_githubs():
    text = "# Keys, limits and demand\n## The router (`router_overhead`, `x`)\n## Twice\n## Twice\n"
    assert anchors(text) == {
        "keys-limits-and-demand",
        "the-router-router_overhead-x",
        "twice",
        "twice-1",
    }
