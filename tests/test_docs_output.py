"""Output shown in docs/ is what the current code prints.

Every output block of docs/*.md (a fence with no language or ``text``,
indented ones in lists included) is one of:

* a **transcript**: its first line is ``$ COMMAND``. Each ``$`` line (with
  ``\\``-continued lines) is a command, the lines after it, up to the next
  ``$`` line, its output. ``$ VAR=value`` sets a shell variable for the rest
  of the page (``$VAR`` / ``${VAR}`` expand); ``VAR=value`` before a command
  sets an environment variable for that command. Every command must be a
  ``shardplan`` command that exits 0: the test runs it in-process
  (``planner.cli.main``) as if on a terminal, from a scratch directory laid
  out like the repository root (its ``../shared`` is the reference data's,
  so ``../shared/reference/...`` resolves and files the command writes do not
  land in the checkout; without the reference data a command naming it is
  skipped), with ``COLUMNS`` the page's ``COLUMNS=N`` (its
  prose says it, e.g. "``COLUMNS=150`` for the table width"; 80 where it says
  none), and the printed text (colours stripped, trailing spaces dropped)
  must equal the shown output. A line ``...`` elides one or more lines of
  the real output; the shown lines around it must match in order. Timings
  vary from run to run, so the number in each phrase of ``_TIMINGS`` is
  replaced by ``<t>`` on both sides before comparing; nothing else is
  normalised.
* a **command list** or usage synopsis, no output: every line is a command
  (it starts with one of ``_PROGRAMS``, after any ``VAR=value`` environment
  settings; a trailing ``# comment`` is allowed)
  or continues one (the line before ends with ``\\``, or it is indented and
  starts with ``[`` or ``-``, as a synopsis's options). Those commands are run
  where their page's tests run them (tests/test_docs.py for the quick start).
* **exempt**: on a page of ``EXEMPT_PAGES`` or in ``EXEMPT_BLOCKS``, with the
  reason there.

Anything else fails ``test_every_output_block_is_checked_or_exempt``: a new
output block must be written as a transcript, or be given an exemption and
its reason.
"""

from __future__ import annotations

import difflib
import re
import shlex
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from reference_files import MISSING_REASON, reference_dir

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"

# Pages whose output blocks are all exempt, and why.
EXEMPT_PAGES = {
    "benchmarks.md": "recorded benchmark runs of the scripts in benchmarks/ (timings on a shared machine)",
    "fidelity.md": "recorded benchmark runs of the scripts in benchmarks/ (timings on a shared machine)",
    "references.md": "formulas and tables quoted from the two papers' notes, not program output",
}
# Single exempt blocks, by page and how their first line (stripped) starts, and why.
EXEMPT_BLOCKS = {
    ("costmodel.md", "model resnet152: 514 layers"):
        "a recorded run of benchmarks/costmodel_speed.py (evaluations per second on the 2-core machine)",
    ("design.md", "costmodels/           the bottom: layer arrays"):
        "a diagram: the package tree, not program output",
    ("design.md", "LayerTable                CostTable                Solution"):
        "a diagram of the packages, not output",
    ("llm-scale.md", "id               t   S   d     B    b   v measured"):
        "a recorded run of benchmarks/megatron.py (benchmarks/results/megatron.json)",
    ("llm-scale.md", "In-sample: matmul"):
        "a recorded run of benchmarks/megatron_fit.py (benchmarks/results/megatron_fit.json)",
    ("multi-host.md", "python -m planner.launch: error: process 1 (pid 41873) exited with signal SIGKILL"):
        "a sample error line (its pid and time vary); tests/test_multiprocess.py checks the message",
}
# First words of the lines of a command list.
_PROGRAMS = ("shardplan", "python", "python3", "pip")
_ENV_ASSIGNMENT = re.compile(r"[A-Z_][A-Z0-9_]*=\S*")
# Phrases whose number is a wall-clock time: group 2 is the number, groups 1 and 3 are kept.
_TIMINGS = [
    re.compile(r"(shape\(s\)\s+in\s+)(\d+(?:\.\d+)?)(\s+s\b)"),  # shardplan plan: "searched 4 mesh shape(s) in 1.44 s"
]
_ELISION = "..."
_OPEN = re.compile(r"^([ \t]*)```[ \t]*([\w+-]*)[^\n]*$")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Block(NamedTuple):
    page: str  # file name in docs/
    line: int  # line of the opening fence, 1-based
    lang: str
    lines: list[str]  # contents, without the fence's indentation

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"


def fenced_blocks(text: str, page: str) -> list[Block]:
    """Every fenced block of a page, in order; a fence may be indented (inside a list item)."""
    out: list[Block] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = _OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = len(m.group(1)), m.group(2)
        end = next((j for j in range(i + 1, len(lines)) if re.fullmatch(r"[ \t]*```[ \t]*", lines[j])), None)
        assert end is not None, f"docs/{page}:{i + 1}: unclosed code fence"
        body = [ln[indent:] if ln[:indent].strip() == "" else ln for ln in lines[i + 1:end]]
        out.append(Block(page, i + 1, lang, body))
        i = end + 1
    return out


def output_blocks() -> list[Block]:
    pages = sorted(DOCS.glob("*.md"))
    return [b for p in pages for b in fenced_blocks(p.read_text(encoding="utf-8"), p.name) if b.lang in ("", "text")]


def is_transcript(block: Block) -> bool:
    return bool(block.lines) and block.lines[0].startswith("$ ")


def is_command_list(lines: list[str]) -> bool:
    """Only commands and their continuation lines (see the module docstring)."""
    lines = [ln for ln in lines if ln.strip()]
    if not lines:
        return False
    previous = None
    for ln in lines:
        continues = previous is not None and (
            previous.rstrip().endswith("\\") or (ln[:1] in " \t" and ln.lstrip()[:1] in "[-"))
        words = ln.split()
        while words and _ENV_ASSIGNMENT.fullmatch(words[0]):  # VAR=value before a command sets its environment
            words.pop(0)
        if not continues and (ln[:1] in " \t" or not words or words[0] not in _PROGRAMS):
            return False
        previous = ln
    return True


def _first_line(block: Block) -> str:
    return next((ln.strip() for ln in block.lines if ln.strip()), "")


def exemption(block: Block) -> str | None:
    """Why ``block`` is exempt, or None."""
    if block.page in EXEMPT_PAGES:
        return EXEMPT_PAGES[block.page]
    return next((why for (page, start), why in EXEMPT_BLOCKS.items()
                 if page == block.page and _first_line(block).startswith(start)), None)


def _transcripts() -> list[Block]:
    return [b for b in output_blocks() if is_transcript(b) and not exemption(b)]


# -- the rules ----------------------------------------------------------------------


def test_every_output_block_is_checked_or_exempt():
    blocks = output_blocks()
    unknown = [b.where for b in blocks if not (is_transcript(b) or is_command_list(b.lines) or exemption(b))]
    assert not unknown, (
        "output blocks neither checked nor exempt (write them as `$ shardplan ...` transcripts of the current "
        "code's output, or add an exemption with its reason to tests/test_docs_output.py): " + ", ".join(unknown)
    )
    stale = [f"docs/{page}: {start!r}" for page, start in EXEMPT_BLOCKS
             if not any(b.page == page and _first_line(b).startswith(start) for b in blocks)]
    assert not stale, "EXEMPT_BLOCKS names blocks the docs no longer have: " + "; ".join(stale)
    missing = [page for page in EXEMPT_PAGES if not (DOCS / page).is_file()]
    assert not missing, "EXEMPT_PAGES names missing pages: " + ", ".join(missing)
    # The pages known to show output are still checked (not silently reclassified).
    assert {b.page for b in _transcripts()} >= {"quickstart.md", "oracle.md"}


def test_block_rules():
    assert is_command_list(["shardplan plan m --devices 8   # exit 1", "python -m x \\", "  --flag"])
    assert is_command_list(["shardplan oracle MODEL --devices 16", "    [--rank] [--json]"])
    assert not is_command_list(["shardplan plan m", "  vgg16 on 8 x cpu", " name   kind"])  # a command, then output
    assert not is_command_list(["model resnet152: 514 layers"])
    assert fenced_blocks("a\n```\n$ shardplan x\nout\n```\n- item\n\n   ```text\n   y\n   ```\n", "x.md") == [
        Block("x.md", 2, "", ["$ shardplan x", "out"]), Block("x.md", 8, "text", ["y"])]


# -- transcripts --------------------------------------------------------------------


def commands(lines: list[str]) -> list[tuple[str, list[str]]]:
    """(command line, shown output lines) of a transcript; continued lines joined."""
    out: list[tuple[str, list[str]]] = []
    it = iter(lines)
    for ln in it:
        if ln.startswith("$ "):
            cmd = ln[2:]
            while cmd.rstrip().endswith("\\"):
                cmd = cmd.rstrip()[:-1] + " " + next(it).strip()
            out.append((cmd, []))
        else:
            out[-1][1].append(ln)
    return out


def normalise(text: str) -> list[str]:
    """Colours stripped, timings replaced by <t>, trailing spaces and blank end lines dropped."""
    text = _ANSI.sub("", text)
    for pattern in _TIMINGS:
        text = pattern.sub(r"\g<1><t>\g<3>", text)
    lines = [ln.rstrip() for ln in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def matches(shown: list[str], real: list[str]) -> bool:
    """``shown`` equals ``real``, where a line ``...`` in ``shown`` stands for one or more lines of ``real``."""
    parts = "\n".join(
        r"(?:[^\n]*\n)*[^\n]*" if ln.strip() == _ELISION else re.escape(ln) for ln in shown)
    return re.fullmatch(parts, "\n".join(real)) is not None


def test_matches_and_normalise():
    real = ["title", "a", "b", "c", "end"]
    assert matches(real, real)
    assert matches(["title", " ...", "c", "end"], real)
    assert not matches(["title", " ...", "b", "a", "end"], real)  # order
    assert not matches(["title", "a", "b", "c"], real)  # a missing tail line
    assert not matches(["title", "a", "b", "c", "end!"], real)
    assert normalise("\x1b[1mx\x1b[0m  \nsearched 4 mesh\nshape(s) in 12.5 s; done\n\n") == [
        "x", "searched 4 mesh", "shape(s) in <t> s; done"]


def _page_columns(page: str) -> str:
    m = re.search(r"`COLUMNS=(\d+)`", (DOCS / page).read_text(encoding="utf-8"))
    return m.group(1) if m else "80"


def _expand(text: str, variables: dict[str, str]) -> str:
    def value(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        assert name in variables, f"${name} is not set by a `$ {name}=...` line before it on the page"
        return variables[name]

    return re.sub(r"\$(?:\{(\w+)\}|(\w+))", value, text)


def _split(cmd: str, variables: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """(the VAR=value words it starts with, the rest) of a command line, $VAR expanded."""
    words = shlex.split(_expand(cmd, variables))
    env = {}
    while words and re.fullmatch(r"\w+=\S*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words


def _page_variables(block: Block) -> dict[str, str]:
    """The shell variables the ``$ VAR=value`` lines of the page's transcripts before ``block`` set."""
    variables: dict[str, str] = {}
    for earlier in output_blocks():
        if earlier.page == block.page and earlier.line < block.line and is_transcript(earlier):
            for cmd, _ in commands(earlier.lines):
                env, words = _split(cmd, variables)
                if not words:
                    variables.update(env)
    return variables


def _scratch_repo(tmp_path: Path) -> Path:
    """A working directory like the repository root: ``../shared`` is the reference data's ``shared``."""
    (tmp_path / "shared").symlink_to(reference_dir().parent, target_is_directory=True)
    (tmp_path / "main").mkdir()
    return tmp_path / "main"


@pytest.mark.slow
@pytest.mark.parametrize("block", _transcripts(), ids=lambda b: f"{b.page}:{b.line}")
def test_transcript_is_current_output(block, tmp_path, monkeypatch, capsys):
    from planner.cli import main

    monkeypatch.chdir(_scratch_repo(tmp_path))
    columns = _page_columns(block.page)
    variables = _page_variables(block)
    ran = 0
    for cmd, shown in commands(block.lines):
        env, words = _split(cmd, variables)
        if not words:  # $ VAR=value: a shell variable for the rest of the page
            variables.update(env)
            assert not shown, f"{block.where}: `$ {cmd}` shows output"
            continue
        assert words[0] == "shardplan", f"{block.where}: `$ {cmd}` is not a shardplan command"
        if any("shared/reference" in w for w in words) and not reference_dir().is_dir():
            pytest.skip(MISSING_REASON)
        monkeypatch.setenv("COLUMNS", columns)
        monkeypatch.setenv("TERM", "xterm")  # not "dumb", at which rich ignores COLUMNS; colours are stripped
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
        status = main(words[1:])
        out = capsys.readouterr()
        real = normalise(out.out + out.err)
        assert status == 0, f"{block.where}: `$ {cmd}` exited {status}: {out.err.strip()}"
        expected = normalise("\n".join(shown))
        if not matches(expected, real):
            diff = "\n".join(difflib.unified_diff(expected, real, "shown", "printed now", lineterm=""))
            pytest.fail(f"{block.where}: the output of `$ {cmd}` is not what the code prints now "
                        f"(regenerate the block by running it with COLUMNS={columns}"
                        f"{'; a shown line ... stands for elided lines' if _ELISION in map(str.strip, shown) else ''}"
                        f"):\n{diff}", pytrace=False)
        ran += 1
    assert ran, f"{block.where}: a transcript without a shardplan command"
