"""The documentation against the code: every public name is documented, the
CLI reference covers every subcommand and option the parsers (and their
``--help``) have, every relative link and anchor resolves, tables are well
formed, and the quick start's commands and Python blocks run, with the
values its comments state."""

from __future__ import annotations

import argparse
import ast
import importlib
import io
import json
import re
import shlex
import tokenize
from pathlib import Path

import pytest
from reference_files import reference_dir

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PACKAGES = ("planner", "costmodels", "search")
# Pages other issues are writing now; links to them pass while they are missing.
# Empty this set once they exist.
_PENDING_PAGES: set[str] = set()

_FENCE = re.compile(r"^```[^\n]*\n.*?^```[ \t]*$", re.MULTILINE | re.DOTALL)
_SPAN = re.compile(r"`([^`\n]+)`")
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:[ \t]+\"[^\"]*\")?\)")


def _doc_pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def _prose(text: str) -> str:
    """Markdown without its fenced code blocks."""
    return _FENCE.sub("", text)


def documented_names(text: str) -> set[str]:
    """Names a page documents: every dotted component of the identifier chain
    an inline code span starts with (`planner.plan(...)` documents planner
    and plan; `shardplan plan` documents shardplan only), and every word of
    a heading."""
    prose = _prose(text)
    names: set[str] = set()
    for span in _SPAN.findall(prose):
        m = re.match(r"\s*([A-Za-z_][\w.]*)", span)
        if m:
            names.update(p for p in m.group(1).split(".") if p)
    for _, heading in _HEADING.findall(prose):
        names.update(re.findall(r"[A-Za-z_]\w*", heading))
    return names


def test_documented_names_rule():
    text = "## The `Plan` file\n\nUse `planner.plan(graph)` or `shardplan layers`.\n```python\nhidden_name()\n```\n"
    names = documented_names(text)
    assert {"Plan", "planner", "plan", "shardplan"} <= names
    assert "layers" not in names and "hidden_name" not in names


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_is_documented(package):
    text = "\n".join(p.read_text(encoding="utf-8") for p in _doc_pages())
    names = documented_names(text)
    module = importlib.import_module(package)
    missing = [n for n in module.__all__ if n not in names]
    assert not missing, (
        f"{package}.__all__ names not documented in docs/*.md (as `name`, `{package}.name` or in a heading): "
        f"{', '.join(missing)}"
    )


# -- the CLI reference ---------------------------------------------------------------


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    from planner.cli import _parser

    for action in _parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("planner.cli._parser() registers no subcommands")


def _headings(text: str) -> list[re.Match]:
    """Heading matches of ``text``, leaving out lines inside fenced code blocks."""
    fences = [m.span() for m in _FENCE.finditer(text)]
    return [h for h in _HEADING.finditer(text) if not any(a <= h.start() < b for a, b in fences)]


def _section(text: str, command: str) -> str | None:
    """The part of cli.md under the heading that names ``shardplan COMMAND``,
    down to the next heading of the same or a higher level."""
    headings = _headings(text)
    for i, h in enumerate(headings):
        if re.search(rf"\bshardplan {re.escape(command)}\b", h.group(2)):
            level = len(h.group(1))
            end = next((g.start() for g in headings[i + 1:] if len(g.group(1)) <= level), len(text))
            return text[h.start():end]
    return None


def _usage_options(help_text: str) -> set[str]:
    usage = help_text.split("\n\n", 1)[0]
    return set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", usage)) - {"-h", "--help"}


def _mentions(section: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", section) is not None


def test_cli_reference_covers_every_subcommand_and_option(capsys):
    from planner.cli import main

    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    problems = []
    for name, sub in _subcommands().items():
        section = _section(text, name)
        if section is None:
            problems.append(f"no heading naming `shardplan {name}`")
            continue
        assert main([name, "--help"]) == 0
        options = _usage_options(capsys.readouterr().out)
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            options.update(action.option_strings)
            if not action.option_strings and not _mentions(section, str(action.metavar or action.dest)):
                problems.append(f"shardplan {name}: positional {action.metavar or action.dest}")
            for choice in action.choices or ():
                if not _mentions(section, str(choice)):
                    problems.append(f"shardplan {name}: choice {choice!r} of {'/'.join(action.option_strings)}")
        problems += [f"shardplan {name}: option {o}" for o in sorted(options) if not _mentions(section, o)]
    assert not problems, "docs/cli.md does not document: " + "; ".join(problems)


# -- links, anchors, tables ----------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in _headings(text):
        s = slug(h.group(2))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def test_slug_matches_github():
    assert slug("## `solve` and its methods (`search.solve`)".lstrip("# ")) == "solve-and-its-methods-searchsolve"
    assert slug("2. Collectives: alpha-beta") == "2-collectives-alpha-beta"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


def _linked_pages() -> list[Path]:
    return [*_doc_pages(), REPO / "README.md"]


def _resolve(page: Path, target: str) -> tuple[Path | None, str]:
    """(file, why not) for a relative link target without its fragment;
    links into shared/reference resolve beside or inside the repository."""
    path = (page.parent / target).resolve()
    if path == REPO or REPO in path.parents:
        return path, ""
    shared = REPO.parent / "shared"
    if path == shared or shared in path.parents:
        rest = path.relative_to(shared)
        for root in (shared, REPO / "shared"):
            if (root / rest).exists():
                return root / rest, ""
        if not reference_dir().is_dir():
            return None, "shared/ not available here"
        return path, ""
    return path, "outside the repository and shared/"


def test_relative_links_and_anchors_resolve():
    broken = []
    for page in _linked_pages():
        text = page.read_text(encoding="utf-8")
        for target in _LINK.findall(_prose(text)):
            if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, fragment = target.partition("#")
            where = f"{page.relative_to(REPO)}: ({target})"
            if file_part:
                path, why = _resolve(page, file_part)
                if path is None:
                    continue
                if why:
                    broken.append(f"{where} {why}")
                    continue
                if not path.exists():
                    if path.parent == DOCS and path.name in _PENDING_PAGES:
                        continue
                    broken.append(f"{where} no such file")
                    continue
            else:
                path = page
            if fragment and path.suffix == ".md" and fragment not in anchors(path.read_text(encoding="utf-8")):
                broken.append(f"{where} no heading with anchor #{fragment}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_index_lists_every_page():
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    linked = {t.partition("#")[0] for t in _LINK.findall(index)}
    missing = [p.name for p in _doc_pages() if p.name != "index.md" and p.name not in linked]
    assert not missing, f"docs/index.md does not link {', '.join(missing)}"


def test_tables_are_well_formed():
    """Every row of a Markdown table has as many cells as its header (a bare
    | inside a cell, e.g. in `|w|`, must be written \\|)."""
    bad = []
    for page in _linked_pages():
        rows: list[tuple[int, str]] = []
        lines = _prose(page.read_text(encoding="utf-8")).split("\n") + [""]
        for i, line in enumerate(lines, 1):
            if line.startswith("|"):
                rows.append((i, line))
                continue
            if rows:
                cells = [len(re.findall(r"(?<!\\)\|", r)) for _, r in rows]
                bad += [f"{page.name}:{n}" for (n, _), c in zip(rows, cells, strict=True) if c != cells[0]]
                rows = []
    assert not bad, "table rows with the wrong number of cells: " + ", ".join(bad)


def test_every_preset_is_described():
    from costmodels import preset_names

    text = (DOCS / "hardware-format.md").read_text(encoding="utf-8")
    missing = [n for n in preset_names() if f"| `{n}` |" not in text]
    assert not missing, f"docs/hardware-format.md's preset table lacks {', '.join(missing)}"


# -- runnable examples ---------------------------------------------------------------


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}[ \t]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def _comments(source: str) -> dict[int, str]:
    return {
        tok.start[0]: tok.string[1:].strip()
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }


def run_checked(source: str, namespace: dict, where: str) -> int:
    """Run a Python block statement by statement; where an expression
    statement ends in a comment that is a Python literal, the expression must
    equal it. Returns how many values were checked."""
    tree = ast.parse(source)
    comments = _comments(source)
    checked = 0
    for stmt in tree.body:
        module = ast.Module(body=[stmt], type_ignores=[])
        if isinstance(stmt, ast.Expr):
            value = eval(compile(ast.Expression(stmt.value), where, "eval"), namespace)
            comment = comments.get(stmt.end_lineno, "")
            try:
                expected = ast.literal_eval(comment)
            except (ValueError, SyntaxError):
                continue
            if "..." in comment:  # an abridged value: not checked
                continue
            assert value == expected, f"{where}, line {stmt.lineno}: {ast.unparse(stmt)} is {value!r}, not {expected!r}"
            checked += 1
        else:
            exec(compile(module, where, "exec"), namespace)  # noqa: S102 -- running the docs is the point
    return checked


def test_run_checked_compares_values():
    ns: dict = {}
    assert run_checked("x = 2\nx + 1  # 3\nx  # not a literal\n(x, 3)  # (2, ...)\n", ns, "t") == 1
    with pytest.raises(AssertionError, match="is 2, not 5"):
        run_checked("x  # 5\n", ns, "t")


def test_hardware_format_examples_run():
    text = (DOCS / "hardware-format.md").read_text(encoding="utf-8")
    blocks = _blocks(text, "python")
    assert blocks
    ns: dict = {}
    for i, block in enumerate(blocks):
        run_checked(block, ns, f"hardware-format.md python block {i}")
    assert ns["mine"].gradient_overlap == 0.5 and ns["mine"].tiers == ns["hw"].tiers
    # The example file is valid and is the preset it shows, numbers and all.
    from costmodels import hardware_from_dict, load_hardware

    (example,) = _blocks(text, "json")
    shown, preset = hardware_from_dict(json.loads(example)), load_hardware("dgx-a100")
    assert (shown.name, shown.device, shown.devices_per_node, shown.tiers) == (
        preset.name, preset.device, preset.devices_per_node, preset.tiers)


@pytest.mark.slow
def test_quickstart_commands_run(tmp_path, monkeypatch, capsys):
    from planner.cli import main

    monkeypatch.chdir(tmp_path)
    text = (DOCS / "quickstart.md").read_text(encoding="utf-8")
    lines = [ln.strip() for b in _blocks(text, "bash") for ln in b.splitlines() if ln.strip().startswith("shardplan ")]
    assert len(lines) >= 4
    for line in lines:
        command, _, comment = line.partition("#")
        m = re.match(r"\s*exit (\d+)", comment)
        expected = int(m.group(1)) if m else 0
        status = main(shlex.split(command)[1:])
        out = capsys.readouterr()
        assert status == expected, f"{line!r} exited {status}: {out.err.strip()}"
        if expected:
            assert out.err.startswith("shardplan: error: ")


@pytest.mark.slow
def test_quickstart_python_runs(devices, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    text = (DOCS / "quickstart.md").read_text(encoding="utf-8")
    ns: dict = {"__name__": "quickstart"}
    checked = sum(
        run_checked(block, ns, f"quickstart.md python block {i}") for i, block in enumerate(_blocks(text, "python"))
    )
    assert checked >= 8
    # What the prose says of the 8-device plan of SmallCNN.
    p = ns["p"]
    assert p.mesh == (4, 2)
    assert p.strategies["fc1"] == "filter"
    assert {p.strategies[n] for n in ("conv1", "conv2")} == {"data"}
    assert ns["loss"].shape == ()
    assert "P(None, 'model')" in capsys.readouterr().out


# -- the README's examples chain -------------------------------------------------------------


def _readme_commands() -> list[tuple[dict[str, str], list[str]]]:
    """(environment assignments, argv) of each ``shardplan`` line of the README's bash blocks."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    out = []
    for block in _blocks(text, "bash"):
        for line in block.splitlines():
            words = shlex.split(line.partition("  #")[0].partition("\t#")[0])
            env = {}
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
                k, _, v = words.pop(0).partition("=")
                env[k] = v
            if words and words[0] == "shardplan":
                out.append((env, words[1:]))
    return out


def _option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_readme_examples_chain():
    """A command that reads a plan (validate --plan, plot, evaluate --plan)
    reads one a line above it wrote (-o), for the same model, and validate runs
    with as many devices as that plan was made for."""
    written: dict[str, list[str]] = {}
    readers = 0
    for env, argv in _readme_commands():
        plan_file = _option(argv, "--plan") or (argv[1] if argv[0] == "plot" else None)
        if plan_file is not None:
            readers += 1
            assert plan_file in written, f"README: `shardplan {' '.join(argv)}` reads {plan_file}, no line above writes it"
            made = written[plan_file]
            if argv[0] in ("validate", "evaluate"):
                assert argv[1] == made[1], f"README: {plan_file} is a plan of {made[1]}, not {argv[1]}"
            if argv[0] == "validate":
                assert env.get("JAX_NUM_CPU_DEVICES") == _option(made, "--devices"), (
                    f"README: validate needs {_option(made, '--devices')} devices (JAX_NUM_CPU_DEVICES on a CPU)")
        if argv[0] == "plan" and _option(argv, "-o"):
            written[_option(argv, "-o")] = argv
    assert readers >= 2


@pytest.mark.slow
def test_readme_plan_then_validate_runs(tmp_path, monkeypatch, capsys):
    """The README's plan -> validate pair, run as written (8 fake CPU devices here, as JAX_NUM_CPU_DEVICES=8)."""
    from planner.cli import main

    monkeypatch.chdir(tmp_path)
    cmds = [argv for _, argv in _readme_commands() if argv[0] == "validate" or (argv[0] == "plan" and "-o" in argv)]
    assert [c[0] for c in cmds] == ["plan", "validate"]
    for argv in cmds:
        status = main(argv + (["--json"] if argv[0] == "validate" else []))
        out = capsys.readouterr()
        assert status == 0, f"`shardplan {' '.join(argv)}` exited {status}: {out.err.strip()}"
    assert json.loads(out.out)["ok"] is True
