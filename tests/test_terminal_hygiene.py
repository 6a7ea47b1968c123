"""What reaches the terminal and what the cache reads: control characters in
names read from files are shown escaped, never acted on; a cache folder
another user owns, or every user may write, is not used."""

from __future__ import annotations

import os
import sys
import warnings

import pytest

import planner.cli as cli
from planner._cache_folder import cache_folder_refusal
from planner._format import printable

_HOSTILE = "CONV\x1b[31m1\x1b]0;pwned\x07\x9b2J\x7f"  # recolour, retitle the window, C1 CSI clear, DEL


def test_printable_escapes_every_control_character_but_newline_and_tab():
    assert printable(_HOSTILE) == "CONV\\x1b[31m1\\x1b]0;pwned\\x07\\x9b2J\\x7f"
    assert printable("a\tb\nc\rd\x00e\x85f") == "a\tb\nc\\x0dd\\x00e\\x85f"
    assert printable("résumé ×") == "résumé ×"  # printable text unchanged


def _net(tmp_path, layer: str, model: str = "tiny") -> str:
    f = tmp_path / "hostile.net"
    f.write_text(f"Dataset|Tiny\nInput|100x3x8x8\nModel|{model}\n{layer}|3x8x8|3x4x3x3|4x8x8|0.5\n"
                 "RELU|4x8x8|4x4x0x0|4x8x8|0\nMPOOL|4x8x8|0x0x2x2|4x4x4|0\nFC|4x4x4|4x10x4x4|10x1x1|0\n")
    return str(f)


def test_a_table_on_a_terminal_shows_hostile_names_escaped(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)  # the table, not JSON
    assert cli.main(["layers", _net(tmp_path, _HOSTILE, model="t\x1b]0;x\x07iny")]) == 0
    out = capsys.readouterr().out
    assert "CONV\\x1b[31m1\\x1b]0;pwned\\x07\\x9b2J\\x7f" in out and "t\\x1b]0;x\\x07iny" in out  # cell and title
    for raw in ("\x1b[31m1", "\x1b]0;", "\x07", "\x9b", "\x7f"):
        assert raw not in out


def test_an_error_line_shows_a_hostile_name_escaped(capsys):
    assert cli.main(["layers", "resnet\x1b[2J"]) == 2
    err = capsys.readouterr().err
    assert "resnet\\x1b[2J" in err and "\x1b" not in err and len(err.strip().splitlines()) == 1


# -- the cache folder --------------------------------------------------------------------------------


def _someone_elses(tmp_path):
    """A folder another user owns: one made and given away (as root), else /."""
    if os.getuid() != 0:
        return "/"
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, 12345, 12345)
    return str(d)


def test_cache_folder_refusal(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    assert cache_folder_refusal(mine, mine / "jax", tmp_path / "not-yet") is None
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert cache_folder_refusal(mine, shared) == f"{shared} is writable by every user (mode 777)"
    assert "belongs to another user" in cache_folder_refusal(_someone_elses(tmp_path))
    (tmp_path / "file").write_text("")
    assert cache_folder_refusal(tmp_path / "file") == f"{tmp_path / 'file'} is not a folder"


@pytest.mark.parametrize("how", ["world-writable", "world-writable-jax-folder", "another-user"])
def test_cli_refuses_an_unsafe_cache_with_one_warning(tmp_path, monkeypatch, capsys, how):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    if how == "world-writable":
        root.chmod(0o777)
    elif how == "world-writable-jax-folder":
        (root / "jax").mkdir()
        (root / "jax").chmod(0o777)
    else:
        root = _someone_elses(tmp_path)
    monkeypatch.setenv("SHARDPLAN_CACHE_DIR", str(root))
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    assert cli.compilation_cache_dir() is None and cli.cost_table_cache_dir() is None
    assert cli.main(["hardware", "--json"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("shardplan: warning: not using the cache: ") and len(err.strip().splitlines()) == 1, err


def test_cli_uses_its_own_cache_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SHARDPLAN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    assert cli.compilation_cache_dir() == tmp_path / "cache" / "jax"
    assert cli.main(["hardware", "--json"]) == 0
    assert capsys.readouterr().err == ""


def test_library_cost_table_cache_refuses_an_unsafe_folder_with_a_warning(tmp_path):
    from planner._table_cache import cached_cost_table

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.warns(RuntimeWarning, match="not using the cost-table cache: .* writable by every user"):
        assert cached_cost_table(lambda: 42, (), None, shared) == 42
    assert list(shared.iterdir()) == []  # nothing written there either
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cached_cost_table(lambda: 42, (), None, None) == 42
