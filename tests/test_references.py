"""docs/references.md against the code's citations: every section of ParaDL
or SplitBrain that a comment or docstring in planner/, costmodels/ or
search/ cites has an entry (a ``## ParaDL §N`` / ``## SplitBrain §N``
heading), and every entry is cited somewhere.

What counts as a citation of section N of a paper, in one file:

* explicit: ``§N`` right after the paper's name, ``paradl.md §N`` (any path
  before it), ``ParaDL §N``, ``ParaDL's §N``, ``splitbrain.md §N``,
  ``SplitBrain §N``, with only spaces, backticks, quotes or an opening
  bracket between (a line break included);
* continued: any other ``§N`` (``§4.3, §4.8``, ``§6 and §7.2``,
  ``per §9``, ``(§4.6)``) belongs to the source cited last before it in the
  same file; a ``§N`` right after another source's name (``jax-notes.md
  §1``, ``cuDNN §3``, ``Wright §17.4``: a word with a capital letter or a
  ``.md`` name, not in brackets: ``dL/dx (§4.6)`` continues) switches to
  that source, whose sections are not checked here;
  before any source in a file, a ``§N`` is not checked;
* a range ``§A-B`` or ``§A-§B`` cites A and B; a trailing dot is not part of
  N (``§3.1.`` is §3.1).
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REFERENCES = REPO / "docs" / "references.md"
PACKAGES = ("planner", "costmodels", "search")

_NUM = r"\d+(?:\.\d+)*"
_SECTION = re.compile(rf"§({_NUM})(?:[ \t]*[-–][ \t]*§?({_NUM}))?")
# The word before a §: a name (paradl.md, ../x/jax-notes.md, ParaDL's, cuDNN) and what separates them.
_BEFORE = re.compile(r"([\w.\-/'’]+)([^\w§]*)$")
_PAPERS = {"paradl": "ParaDL", "splitbrain": "SplitBrain"}
_PAPER_NAME = re.compile(r"(?:.*/)?(paradl|splitbrain)(?:\.md)?(?:['’]s)?", re.IGNORECASE)
_HEADING = re.compile(rf"^##[ \t]+(ParaDL|SplitBrain)[ \t]+§({_NUM})\.?[ \t]*$", re.MULTILINE)

Citation = tuple[str, str]  # (paper, section), e.g. ("ParaDL", "4.4")


def _source_before(text: str) -> str | None:
    """The source named right before a § (see the module docstring): a paper
    ("ParaDL", "SplitBrain"), "other" for another source's name, or None
    when the § continues the current source."""
    m = _BEFORE.search(text[-300:])
    if m is None:
        return None
    word, gap = m.groups()
    if re.search(r"[,;:#]", gap):
        return None
    name = _PAPER_NAME.fullmatch(word)
    if name:
        return _PAPERS[name.group(1).lower()]
    if "(" not in gap and (re.search(r"[A-Z]", word) or word.lower().endswith(".md")):
        return "other"
    return None


def citations_in(text: str) -> list[tuple[Citation, int]]:
    """((paper, section), line) of every ParaDL / SplitBrain section ``text`` cites."""
    out: list[tuple[Citation, int]] = []
    current: str | None = None
    for m in _SECTION.finditer(text):
        source = _source_before(text[: m.start()])
        if source is not None:
            current = source
        if current in _PAPERS.values():
            line = text.count("\n", 0, m.start()) + 1
            out += [((current, n), line) for n in m.groups() if n]
    return out


def code_citations() -> dict[Citation, list[str]]:
    """Every cited section -> the ``file:line`` places that cite it."""
    found: dict[Citation, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            for cite, line in citations_in(text):
                found.setdefault(cite, []).append(f"{path.relative_to(REPO)}:{line}")
    return found


def reference_entries() -> dict[Citation, int]:
    """Each ``## ParaDL §N`` / ``## SplitBrain §N`` heading of docs/references.md -> its line."""
    text = REFERENCES.read_text(encoding="utf-8")
    entries: dict[Citation, int] = {}
    duplicates = []
    for m in _HEADING.finditer(text):
        cite = (m.group(1), m.group(2))
        line = text.count("\n", 0, m.start()) + 1
        if cite in entries:
            duplicates.append(f"{_show(cite)} at docs/references.md:{entries[cite]} and :{line}")
        entries[cite] = line
    assert not duplicates, "docs/references.md has an entry twice: " + "; ".join(duplicates)
    return entries


def _show(cite: Citation) -> str:
    return f"{cite[0]} §{cite[1]}"


def test_citation_rules():
    text = (
        "x (paradl.md §3.1, after NCCL); §3.2 and §10. y (§4.4, sizes per §9).\n"
        "z ``../shared/reference/splitbrain.md``\n  §1.2-1.3; ParaDL's §4.6 / §4.7 §3-§4 §3.1.\n"
        "w (jax-notes.md §2; §5) cuDNN §3 Wright §17.4, 2014, §3 SplitBrain (§1.4) ParaDL §6\n"
    )
    got = [(f"{p} §{n}", line) for (p, n), line in citations_in(text)]
    assert got == [
        ("ParaDL §3.1", 1), ("ParaDL §3.2", 1), ("ParaDL §10", 1), ("ParaDL §4.4", 1), ("ParaDL §9", 1),
        ("SplitBrain §1.2", 3), ("SplitBrain §1.3", 3), ("ParaDL §4.6", 3), ("ParaDL §4.7", 3),
        ("ParaDL §3", 3), ("ParaDL §4", 3), ("ParaDL §3.1", 3),
        ("SplitBrain §1.4", 4), ("ParaDL §6", 4),
    ]
    assert citations_in("no source yet (§5); Higham, \"Algorithms\", §4.2") == []
    assert [c for c, _ in citations_in("ParaDL §4.3: dL/dx (§4.6), NVLink (§9.7)")] == [
        ("ParaDL", "4.3"), ("ParaDL", "4.6"), ("ParaDL", "9.7")]


def test_every_cited_section_has_an_entry():
    entries = reference_entries()
    cited = code_citations()
    assert cited, "found no ParaDL / SplitBrain citation in the code: the citation rules have broken"
    missing = [
        f"{_show(c)} (cited at {where[0]}" + (f" and {len(where) - 1} more" if len(where) > 1 else "") + ")"
        for c, where in sorted(cited.items(), key=lambda kv: kv[1][0])
        if c not in entries
    ]
    assert not missing, (
        "sections cited in the code without a '## <paper> §N' entry in docs/references.md:\n  "
        + "\n  ".join(missing)
    )


def test_every_entry_is_cited():
    cited = code_citations()
    stale = [f"{_show(c)} (docs/references.md:{line})" for c, line in reference_entries().items() if c not in cited]
    assert not stale, (
        "docs/references.md entries that no comment or docstring in planner/, costmodels/, search/ cites "
        "(remove them, or fix the heading):\n  " + "\n  ".join(stale)
    )


def test_every_entry_has_a_body():
    text = REFERENCES.read_text(encoding="utf-8")
    heads = list(_HEADING.finditer(text))
    empty = [
        f"{m.group(1)} §{m.group(2)} (docs/references.md:{text.count(chr(10), 0, m.start()) + 1})"
        for i, m in enumerate(heads)
        if not text[m.end(): heads[i + 1].start() if i + 1 < len(heads) else len(text)].strip()
    ]
    assert not empty, "entries without text: " + ", ".join(empty)
