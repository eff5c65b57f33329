"""Every relative link in the README, BENCHMARKS.md and docs/*.md points at a file that exists and, with an anchor,
at a heading that file has (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens, -1 / -2 for a
repeated heading); and every mention of a page from the code (`docs/runs.md#replay`, `BENCHMARKS.md, "Fan-out"`)
names a page and a heading that exist; and every repository path a page names (`core/model/decode/plan.py`) exists.
A page or a module moved, renamed or split fails here, naming the link."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def pages() -> list[Path]:
    return sorted([*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md")])


def prose_lines(text: str):
    """(line number, line) outside fenced code blocks, with inline code blanked out."""
    fenced = False
    for number, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (the markdown of links and emphasis taken out first)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        found.update(HTML_ANCHOR.findall(line))
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def headings(path: Path) -> list[str]:
    return [re.sub(r"^#+\s+", "", line).strip() for _, line in prose_lines(path.read_text(encoding="utf-8"))
            if re.match(r"^#{1,6}\s", line)]


def broken_links(page: Path) -> tuple[int, list[str]]:
    """How many relative links `page` has, and each one that does not resolve (file:line: target: why)."""
    checked, bad = 0, []
    for number, line in prose_lines(page.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: …: not this repository's
                continue
            checked += 1
            where = f"{page.relative_to(ROOT) if page.is_relative_to(ROOT) else page}:{number}: {target}"
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                bad.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{where}: {dest.name} has no heading #{anchor}")
    return checked, bad


def test_every_relative_link_in_the_docs_resolves():
    assert {"README.md", "BENCHMARKS.md"} <= {p.name for p in pages()}
    assert len(list((ROOT / "docs").glob("*.md"))) >= 8
    total, bad = 0, []
    for page in pages():
        checked, broken = broken_links(page)
        total += checked
        bad += broken
    assert total >= 60, f"only {total} links found: the link pattern no longer matches the pages"
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_the_checker_catches_a_missing_file_a_missing_anchor_and_ignores_code(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## The 4-bit path (issue 25), AVX-512 CPU\n\n"
                                       "## Twice\n\n## Twice\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[ok](other.md#the-4-bit-path-issue-25-avx-512-cpu) [ok](other.md#twice-1) "
                    "[ok](#page) [web](https://example.org/x)\n[gone](missing.md) [no anchor](other.md#nothing)\n"
                    "`[code](missing-in-code.md)`\n```\n[fenced](missing-in-fence.md)\n```\n", encoding="utf-8")
    checked, bad = broken_links(page)
    assert checked == 5
    assert [b.split(": ", 1)[1] for b in bad] == ["missing.md: no such file",
                                                 "other.md#nothing: other.md has no heading #nothing"]


MENTION = re.compile(r"\b((?:docs/)?[A-Za-z][\w-]*\.md)(#[\w-]+)?(?:,? \"([^\"\n]+)\")?")


def _sources() -> list[Path]:
    try:
        tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True,
                                 timeout=30).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        tracked = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()]
    names = set(tracked) | {str(p.relative_to(ROOT)) for d in ("core", "tui", "tokentui", "tests", "scripts",
                                                                "benchmarks") for p in (ROOT / d).rglob("*.py")}
    return sorted(ROOT / n for n in names if n.endswith((".py", ".sh", ".cpp", ".h")) or n.startswith(".ci/"))


def test_every_mention_of_a_page_in_the_code_names_a_page_and_heading_that_exist():
    """`README.md#keys`, `docs/runs.md`, `BENCHMARKS.md, "Fan-out"` in a comment, a docstring, a message or a test:
    the page must exist (a bare name is the top-level page, else docs/), and the anchor or the quoted heading
    (the start of one, as the code quotes them) must be one of its headings."""
    bad, seen = [], 0
    for source in _sources():
        if not source.is_file() or source == Path(__file__).resolve():
            continue
        text = source.read_text(encoding="utf-8", errors="ignore")
        for match in MENTION.finditer(text):
            name, anchor, quoted = match.groups()
            page = ROOT / name if (ROOT / name).exists() or "/" in name else ROOT / "docs" / name
            if name.lower() in {"changelog.md", "license.md"} or name.startswith(("SKILL", "tmp")):
                continue
            seen += 1
            line = text.count("\n", 0, match.start()) + 1
            where = f"{source.relative_to(ROOT)}:{line}: {match.group(0)}"
            if not page.is_file():
                bad.append(f"{where}: no such page")
            elif anchor and anchor[1:] not in anchors(page):
                bad.append(f"{where}: no heading {anchor}")
            elif quoted and not any(h.lower().startswith(quoted.lower()) for h in headings(page)):
                bad.append(f"{where}: no heading starting {quoted!r}")
    assert seen >= 20, f"only {seen} mentions found"
    assert not bad, "mentions of pages that do not resolve:\n" + "\n".join(bad)


PATH_MENTION = re.compile(r"(?<![\w/.-])((?:core|tui|tokentui|tests|scripts|benchmarks|themes|docs|\.ci)/[\w/.-]*\w)")


def test_every_file_a_page_names_exists():
    """`core/model/decode/plan.py`, `tests/unit/test_quantize.py`, `scripts/arch_table.py` in the README, BENCHMARKS.md
    or docs/: each is a file or folder of the repository (a module moved or split has its mentions follow it)."""
    bad, seen = [], 0
    for page in pages():
        for number, line in enumerate(page.read_text(encoding="utf-8").split("\n"), 1):
            for path in PATH_MENTION.findall(line):
                seen += 1
                if not (ROOT / path).exists():
                    bad.append(f"{page.relative_to(ROOT)}:{number}: {path}")
    assert seen >= 50, f"only {seen} paths found"
    assert not bad, "pages name files that do not exist:\n" + "\n".join(bad)
