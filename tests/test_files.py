"""costmodels/files.py: strict JSON reading for every file kind, bounded
reads (regular files of at most MAX_INPUT_BYTES), writes that never destroy
(atomic for regular files: a killed writer leaves the old file whole,
concurrent writers never interleave; through symbolic links; in place for
devices, pipes and open descriptors; folders refused), an output that is an
input refused, and the output path checked before the work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from costmodels import load_calibration, load_hardware
from costmodels.files import (
    MAX_DEPTH,
    MAX_INPUT_BYTES,
    check_not_input,
    check_writable,
    parse_json,
    read_input,
    read_json,
    write_atomic,
)
from planner import get_model
from planner.cli import main
from planner.planning import Plan

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text, message", [
    ('{"a": NaN}', "NaN is not a number JSON allows"),
    ('{"a": -Infinity}', "-Infinity is not a number JSON allows"),
    ('{"a": 1e999}', "overflows to infinity"),
    ('{"batch": ' + "9" * 400 + "}", "integer of 400 digits"),
    ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "nested too deeply"),
    ("[" * 100000 + "]" * 100000, "nested too deeply"),
    ('{"a": 1', "malformed JSON"),
])
def test_parse_json_refuses_with_one_line(text, message):
    with pytest.raises(ValueError, match=message) as e:
        parse_json(text, "x.json")
    assert str(e.value).startswith("x.json: ") and "\n" not in str(e.value)


def test_parse_json_accepts_what_the_formats_hold():
    assert parse_json('{"a": [1, 2.5, -3e-9, {"b": null}], "n": 123456789012345678}', "x") == {
        "a": [1, 2.5, -3e-9, {"b": None}], "n": 123456789012345678}
    assert parse_json("[" * MAX_DEPTH + "]" * MAX_DEPTH, "x") is not None


def _load_graph(path):  # graphs are read through the CLI's model loader
    from planner.cli import load_model

    return load_model(str(path))


@pytest.mark.parametrize("loader, what", [
    (_load_graph, "layer graph"),
    (Plan.read, "plan"),
    (load_hardware, "hardware"),
    (load_calibration, "calibration"),
])
@pytest.mark.parametrize("content, message", [
    (b'{"version": 1, "x": \xff\xfe}', "not UTF-8"),
    (b'{"version": NaN}', "NaN is not a number"),
    (b'{"batch": ' + b"7" * 400 + b"}", "integer of 400 digits"),
    (b"[" * 5000 + b"]" * 5000, "nested too deeply"),
])
def test_every_reader_refuses_bad_json_naming_the_file(tmp_path, loader, what, content, message):
    f = tmp_path / "bad.json"
    f.write_bytes(content)
    with pytest.raises(ValueError, match=message) as e:
        loader(f)
    assert str(f) in str(e.value) and "\n" not in str(e.value), what


def test_cli_bad_json_is_one_line_exit_2(tmp_path, capsys):
    f = tmp_path / "graph.json"
    f.write_text('{"schema": "shardplan/layer-graph", "version": 1e999}')
    assert main(["layers", str(f)]) == 2  # bad input
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "overflows to infinity" in err and str(f) in err


def test_write_atomic_replaces_whole_and_keeps_permissions(tmp_path):
    f = tmp_path / "plan.json"
    write_atomic(f, "old\n")
    os.chmod(f, 0o640)
    write_atomic(f, b"new\n")
    assert f.read_text() == "new\n" and (f.stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]  # no temporary left


@pytest.mark.parametrize("target, message", [
    ("missing/plan.json", "does not exist"),
    (".", "it is a folder"),
])
def test_check_writable_before_the_work(tmp_path, target, message):
    with pytest.raises(ValueError, match=message):
        check_writable(tmp_path / target, "-o")


def test_writer_follows_symbolic_links_to_their_target(tmp_path):
    target = tmp_path / "real" / "plan.json"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "link.json"
    link.symlink_to(Path("real") / "plan.json")  # relative, resolved against the link's folder
    write_atomic(link, "new\n")
    assert link.is_symlink() and os.readlink(link) == os.path.join("real", "plan.json")
    assert target.read_text() == "new\n"
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "real" / "created.json")
    write_atomic(dangling, "made\n")
    assert dangling.is_symlink() and (tmp_path / "real" / "created.json").read_text() == "made\n"


def test_writer_writes_devices_in_place(tmp_path):
    write_atomic(os.devnull, "nothing\n")
    assert Path(os.devnull).is_char_device()
    check_writable("/dev/stdout", "-o")  # an open descriptor, not a folder /dev to rename into
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    write_atomic(fifo, "through the pipe\n")
    assert reader.communicate(timeout=30)[0] == b"through the pipe\n"
    assert fifo.is_fifo()


def test_writer_appends_to_an_open_descriptor_never_replacing_it(tmp_path):
    """``-o /dev/stdout`` with stdout appended to a log: the log keeps what it held."""
    log = tmp_path / "log.txt"
    log.write_text("kept\n")
    code = "from costmodels.files import write_atomic; write_atomic('/dev/stdout', 'added\\n')"
    with open(log, "a") as out:
        subprocess.run([sys.executable, "-c", code], stdout=out, check=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert log.read_text() == "kept\nadded\n"


def test_writer_refuses_folders(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "to_d").symlink_to(tmp_path / "d")
    for target in ("d", "to_d"):
        with pytest.raises(ValueError, match="it is a folder; give a file name"):
            write_atomic(tmp_path / target, "x")
    assert (tmp_path / "d").is_dir() and not any((tmp_path / "d").iterdir())


def test_output_onto_an_input_is_refused_however_named(tmp_path):
    graph = tmp_path / "graph.json"
    graph.write_text("{}")
    (tmp_path / "hard.json").hardlink_to(graph)
    (tmp_path / "soft.json").symlink_to(graph)
    for out in (graph, tmp_path / "hard.json", tmp_path / "soft.json", tmp_path / "sub" / ".." / "graph.json"):
        with pytest.raises(ValueError, match="is one of this command's input files"):
            check_not_input(out, ["vgg16", str(graph)])
    check_not_input(tmp_path / "other.json", [str(graph)])  # a new file
    check_not_input(os.devnull, [os.devnull])  # not a regular file: never destroyed


def test_cli_output_onto_an_input_by_another_name_exits_2_and_keeps_it(tmp_path, capsys):
    from reference_files import TINY_NET

    net = tmp_path / "tiny.net"
    net.write_text(TINY_NET)
    (tmp_path / "again.net").hardlink_to(net)
    (tmp_path / "link.net").symlink_to(net)
    for out in ("again.net", "link.net"):
        assert main(["plan", str(net), "--devices", "4", "--batch", "8", "-o", str(tmp_path / out)]) == 2
        err = capsys.readouterr().err
        assert "is one of this command's input files (the same file as" in err and err.count("\n") == 1, err
    assert net.read_text() == TINY_NET


def test_read_input_refuses_devices_pipes_folders_and_oversize(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # no writer: opening must not wait for one
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(MAX_INPUT_BYTES + 1)  # sparse: nothing written
    cases = [("/dev/zero", "not a regular file"), (fifo, "not a regular file"), (tmp_path, "is a folder"),
             (big, "larger than 64 MiB")]
    for path, words in cases:
        with pytest.raises(ValueError, match=words) as info:
            read_input(path, "plan file")
        assert str(info.value).endswith("expected a plan file")
    ok = tmp_path / "ok.json"
    ok.write_bytes(b"x" * MAX_INPUT_BYTES)
    assert len(read_input(ok, "plan file")) == MAX_INPUT_BYTES


def test_plan_output_checked_before_the_search(tmp_path, capsys, monkeypatch):
    import planner.planning

    def boom(*a, **k):  # the search must not start
        raise AssertionError("planned before checking -o")

    monkeypatch.setattr(planner.planning, "plan", boom)
    assert main(["plan", "vgg16-cifar10", "--devices", "8", "-o", str(tmp_path / "no" / "p.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_killed_writer_leaves_the_old_file_whole(tmp_path):
    """A writer killed after writing its data but before the rename (its fsync
    made to hang) leaves the previous plan intact and readable."""
    good = tmp_path / "plan.json"
    plan_text = json.dumps({"old": True, "pad": "x" * 1000})
    good.write_text(plan_text)
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        import costmodels.files as files
        def hang(fd):
            print("writing", flush=True)
            time.sleep(60)
        files.os.fsync = hang
        files.write_atomic({str(good)!r}, "{{" + "\\"new\\": " + "1" * 10 + ", \\"pad\\": \\"" + "y" * 10_000_000 + "\\"}}")
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "writing"  # the new data is written, not yet renamed
        p.kill()
        p.wait(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
        p.stdout.close()
    assert good.read_text() == plan_text
    assert json.loads(good.read_text())["old"] is True


def test_concurrent_writers_never_interleave(tmp_path):
    """Two processes writing different 2 MB plans to one path 20 times each:
    the file is always one of the two, whole."""
    f = tmp_path / "plan.json"
    write_atomic(f, json.dumps({"w": "start"}))
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(ROOT)!r})
        from costmodels.files import write_atomic
        tag = sys.argv[1]
        for _ in range(20):
            write_atomic({str(f)!r}, json.dumps({{"w": tag, "pad": tag * 2_000_000}}))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, tag]) for tag in ("a", "b")]
    seen = set()
    deadline = time.monotonic() + 60
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        seen.add(json.loads(f.read_text())["w"])  # every read parses
    for p in procs:
        assert p.wait(timeout=60) == 0
    final = json.loads(f.read_text())
    assert final["w"] in ("a", "b") and final["pad"] == final["w"] * 2_000_000
    assert seen <= {"start", "a", "b"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_plan_write_read_round_trip_is_atomic(tmp_path):
    from planner import plan

    p = plan(get_model("vgg16-cifar10"), devices=8, hardware="dgx-a100", batch=64)
    f = tmp_path / "p.json"
    p.write(f)
    assert Plan.read(f) == p
    assert read_json(f, "plan file")["schema"] == "shardplan/plan"
