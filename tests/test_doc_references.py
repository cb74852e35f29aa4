"""Docstrings, comments and docs name only files (and #anchors, § sections) that the repository has."""

import io
import re
import tokenize
from pathlib import Path

import pytest

from tests.test_doc_links import anchors, github_anchor

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
MODULES = sorted((ROOT / "stratarl").rglob("*.py"))

# Planning notes that live outside the repository (users never see them): never cite them.
PRIVATE_NOTE = re.compile(
    r"\b(?:DESIGN|STYLE)(?:\.md)?\s*(?:§\s*[\d.]*\d|principle\s*\d*)|\b(?:DESIGN|STYLE)\.md\b"
    r"|cpu-feasibility|/work/shared|\bshared/reference\b|learning-map"
)
# A path inside the repository: a top-level folder, then segments joined by "/" or "."; a glob
# (`*`), a placeholder (`<name>`, `{x}`, `$X`) or a longer word around it is not a reference.
TOP = r"(?:docs|stratarl|benchmarks|recipes|tests|examples)"
PACKAGES = (
    r"(?:algo|agent|apps|cluster|config|data|engine|observe|reward|rollout|run_directory|trainer"
    r"|transport)"
)
END = r"(?![\w*<>{}$-]|[./][\w*<>{}$])"
ANCHOR = r"(?:#([\w-]+))?"
REPO_PATH = re.compile(rf"(?<![\w./$<-])({TOP}/[\w-]+(?:[./][\w-]+)*){END}{ANCHOR}")
# A segment in capitals is a placeholder (`benchmarks/NAME.py`) or not a path at all ("stratarl/TRL").
PLACEHOLDER = re.compile(r"/[A-Z][A-Z0-9_]+(?:[./]|$)")
# `trainer/step.py`: a module named from its package, as the docs and docstrings abbreviate.
MODULE_PATH = re.compile(rf"(?<![\w./$<-])({PACKAGES}/[\w/]*\w\.py){END}")
# `losses.md`, `algorithms/losses.md#x`, `advantages.md §7`: a page named relative to the docs.
PAGE = re.compile(rf"(?<![\w./$<-])((?:[\w-]+/)*[\w-]+\.md){END}{ANCHOR}(?:\s*§(\d+))?")
MARKDOWN_LINK = re.compile(r"(?<!!)\[[^\]]*\]\([^)\s]*\)")  # its target is test_doc_links's to check
# verl's own files, named as verl names them: `verl/trainer/...`, or right after "verl's" / "verl 0.9".
VERL_BEFORE = re.compile(r"verl(?:'s)?(?: \d[\d.]*\d(?:'s)?)? `?$")


def python_prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and every string that stands alone as a statement (docstrings)."""
    found, previous = [], tokenize.NEWLINE
    skip = {tokenize.NL, tokenize.COMMENT, tokenize.ENCODING}
    statement_start = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    for token in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
        docstring = token.type == tokenize.STRING and previous in statement_start
        if token.type == tokenize.COMMENT or docstring:
            found.append((token.start[0], token.string))
        if token.type not in skip:
            previous = token.type
    return found


def markdown_prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every line of a page."""
    return list(enumerate(path.read_text(encoding="utf-8").splitlines(), start=1))


def _page_problem(file: Path, anchor: str | None, section: str | None) -> str | None:
    if not file.is_file():
        return "no such file"
    if anchor and anchor not in anchors(file):
        return f"no heading with anchor #{anchor}"
    if section and not any(a.startswith(f"{section}-") for a in anchors(file)):
        return f"no heading numbered {section}."
    return None


def broken_references(path: Path, prose: list[tuple[int, str]], root: Path = ROOT) -> list[str]:
    """Every reference in `prose` (of file `path`) that names a private note, a missing file, a
    missing #anchor or a missing numbered § section."""
    where = path.relative_to(root) if path.is_relative_to(root) else path
    broken = []
    for line, text in prose:
        private = list(PRIVATE_NOTE.finditer(text))
        for match in private:
            broken.append(f"{where}:{line}: {match.group(0)!r} names a note outside the repository")
        text = MARKDOWN_LINK.sub(lambda link: " " * len(link.group(0)), text)  # a link's text is a label
        for match in REPO_PATH.finditer(text):
            target, anchor = match.group(1), match.group(2)
            if VERL_BEFORE.search(text[: match.start()]) or PLACEHOLDER.search(target):
                continue
            file = root / target
            if file.is_dir() and not anchor:
                continue
            problem = _page_problem(file, anchor, None) if file.suffix == ".md" else None
            if not file.exists() or problem:
                broken.append(f"{where}:{line}: {match.group(0)}: {problem or 'no such file'}")
        for match in MODULE_PATH.finditer(text):
            if VERL_BEFORE.search(text[: match.start()]):
                continue
            if not (root / "stratarl" / match.group(1)).is_file():
                broken.append(f"{where}:{line}: {match.group(0)}: no such module under stratarl/")
        for match in PAGE.finditer(text):
            name, anchor, section = match.groups()
            if re.match(rf"{TOP}/", name) or VERL_BEFORE.search(text[: match.start()]):
                continue  # a repository path (checked above), or verl's
            if any(note.start() <= match.start() < note.end() for note in private):
                continue  # reported as a private note
            bases = [path.parent, root / "docs", root]  # beside the page, in docs/, at the top
            files = [base / name for base in bases if (base / name).is_file()]
            problem = _page_problem(files[0], anchor, section) if files else "no such file"
            if problem:
                broken.append(f"{where}:{line}: {match.group(0)}: {problem}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_name_only_what_exists(page):
    broken = broken_references(page, markdown_prose(page))
    assert not broken, "\n".join(broken)


def test_docstrings_and_comments_name_only_what_exists():
    broken = [problem for module in MODULES for problem in broken_references(module, python_prose(module))]
    assert not broken, "\n".join(broken)


def test_the_checker_catches_notes_missing_files_anchors_and_sections(tmp_path):
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "page.md"
    page.write_text("# Page\n## 2. Two\n")
    assert f"2-{github_anchor('Two')}" in anchors(page)
    module = tmp_path / "module.py"
    module.write_text(
        '"""See docs/page.md#page, docs/page.md#nope and docs/gone.md."""\n'
        "x = 'docs/gone.md in a plain string is not prose'\n"
        "# DESIGN.md §3, STYLE principle 4; engine/absent.py; recipes/*.yaml, docs/<name>.md and\n"
        "# benchmarks/NAME.py are not paths, nor is stratarl/TRL; docs/ and docs/page.md are\n"
        "y = 1  # page.md §2 exists, page.md §3 does not; [STYLE §2](docs/page.md) is a private note\n"
    )
    broken = broken_references(module, python_prose(module), root=tmp_path)
    assert [b.split(": ", 1)[1] for b in broken] == [
        "docs/page.md#nope: no heading with anchor #nope",
        "docs/gone.md: no such file",
        "'DESIGN.md §3' names a note outside the repository",
        "'STYLE principle 4' names a note outside the repository",
        "engine/absent.py: no such module under stratarl/",
        "'STYLE §2' names a note outside the repository",
        "page.md §3: no heading numbered 3.",
    ]
