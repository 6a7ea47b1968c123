"""The CLI's single error boundary: bad input is one line and exit 2,
Ctrl-C one line and exit 130, an internal error one line asking for a
report and pointing at --debug / SHARDPLAN_DEBUG (which show the
traceback), exit 3."""

from __future__ import annotations

import pytest

import planner.cli as cli
from planner.usage import InternalError


def _raising(exc):
    def run(args):
        raise exc
    return run


@pytest.fixture
def layers_raises(monkeypatch):
    def patch(exc):
        monkeypatch.setattr(cli, "_run_layers", _raising(exc))
    return patch


@pytest.mark.parametrize("exc, status, words", [
    (ValueError("bad batch 3"), 2, "error: bad batch 3"),
    (KeyboardInterrupt(), 130, "interrupted"),
    (TypeError("unsupported operand"), 3, "internal error: TypeError: unsupported operand"),
    (ZeroDivisionError("division by zero"), 3, "--debug or SHARDPLAN_DEBUG=1"),
    (InternalError("extract: module 'a' produced no layer"), 3, "produced no layer. This is a bug in shardplan"),
])
def test_every_exception_is_one_line(layers_raises, capsys, monkeypatch, exc, status, words):
    monkeypatch.delenv("SHARDPLAN_DEBUG", raising=False)
    layers_raises(exc)
    assert cli.main(["layers", "vgg16"]) == status
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and words in err and "Traceback" not in err


def test_debug_shows_the_traceback(layers_raises, monkeypatch):
    layers_raises(TypeError("boom"))
    monkeypatch.delenv("SHARDPLAN_DEBUG", raising=False)
    with pytest.raises(TypeError, match="boom"):
        cli.main(["--debug", "layers", "vgg16"])
    monkeypatch.setenv("SHARDPLAN_DEBUG", "1")
    with pytest.raises(TypeError, match="boom"):
        cli.main(["layers", "vgg16"])


@pytest.mark.parametrize("source, words", [
    ("def make():\n    raise RuntimeError('no weights here')\n", "mod_x:make() raised RuntimeError: no weights here"),
    ("import sys\ndef make():\n    sys.exit(3)\n", "mod_x:make() called exit(3)"),
    ("def make():\n    return 42\n", "mod_x:make() returned int, not a (module, example_input) pair"),
    ("def make(batch):\n    return 1, 2\n", "mod_x:make needs arguments"),
    ("raise KeyError('at import')\ndef make():\n    pass\n", "importing 'mod_x' raised KeyError"),
    ("import sys\nsys.exit(0)\n", "importing 'mod_x' called exit(0)"),
])
def test_a_misbehaving_factory_is_one_line_naming_it(tmp_path, monkeypatch, capsys, source, words):
    """Factories (pkg.module:factory) that raise, exit or return the wrong thing."""
    import sys

    (tmp_path / "mod_x.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mod_x", raising=False)
    assert cli.main(["layers", "mod_x:make"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and words in err, err
