"""Plots of a plan: what is drawn, read back from the axes, against
the plan's own numbers (per-layer seconds and bytes, the limit) and against
hand-computed values for a hand-written search history; the PNG's magic
bytes; the CLI's exit codes and one-line errors, with and without
matplotlib."""

from __future__ import annotations

import dataclasses
import itertools
import math
import sys

import pytest

import planner
from costmodels import STRATEGY_NAMES
from planner.cli import main
from planner.plot import (
    STRATEGY_COLORS,
    plot_history,
    plot_plan,
    plot_plan_memory,
    plot_plan_time,
)
from search import HistoryEntry

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# limit 100 bytes: memory 150 (over), 90, 60, unknown (rounded), 50
HISTORY = (
    HistoryEntry("relaxed", 0.004, 150.0, False),
    HistoryEntry("relaxed", 0.003, 90.0, True),
    HistoryEntry("relaxed", 0.002, 60.0, True),
    HistoryEntry("rounded", 0.0025, math.nan, True),
    HistoryEntry("local_search", 0.0021, 50.0, True),
)


@pytest.fixture(scope="module")
def plan():
    return planner.plan("vgg16-cifar10", devices=8, hardware="dgx-a100")


@pytest.fixture(scope="module")
def plan_file(plan, tmp_path_factory):
    path = tmp_path_factory.mktemp("plot") / "plan.json"
    plan.write(path)
    return path


def _mpl():
    return pytest.importorskip("matplotlib")


def _container(ax, label):
    (found,) = [c for c in ax.containers if c.get_label() == label]
    return list(found)


def _line(ax, label):
    (found,) = [ln for ln in ax.get_lines() if ln.get_label() == label]
    return found


def test_strategy_colors_cover_every_strategy_once():
    assert tuple(STRATEGY_COLORS) == STRATEGY_NAMES
    assert len(set(STRATEGY_COLORS.values())) == len(STRATEGY_NAMES)


@pytest.mark.slow
def test_time_bars_are_the_plans_seconds(plan):
    mpl = _mpl()
    from matplotlib.figure import Figure

    given = Figure().subplots()
    ax = plot_plan_time(plan, given)
    assert ax is given
    layers = plan.layers
    compute, comm, reshard = (_container(ax, k) for k in ("compute", "communication", "resharding"))
    assert len(compute) == len(comm) == len(reshard) == len(layers)
    for i, (r, a, b, c) in enumerate(zip(layers, compute, comm, reshard, strict=True)):
        assert a.get_x() + a.get_width() / 2 == pytest.approx(i)
        assert (a.get_y(), a.get_height()) == pytest.approx((0.0, r.compute_s * 1e3))
        assert (b.get_y(), b.get_height()) == pytest.approx((r.compute_s * 1e3, r.comm_s * 1e3))
        assert (c.get_y(), c.get_height()) == pytest.approx(((r.compute_s + r.comm_s) * 1e3, r.reshard_s * 1e3))
        want = mpl.colors.to_rgba(STRATEGY_COLORS[r.strategy])
        assert a.get_facecolor() == pytest.approx(want) and c.get_facecolor() == pytest.approx(want)
    # the stacks add up to the plan's predicted iteration time
    assert sum(c.get_y() + c.get_height() for c in reshard) == pytest.approx(plan.iteration_s * 1e3, rel=1e-5)
    assert [t.get_text() for t in ax.get_xticklabels()] == [r.name for r in layers]
    assert len({r.strategy for r in layers}) >= 2  # the colour check above compares different colours
    legend = {t.get_text() for t in ax.get_legend().get_texts()}
    assert {r.strategy for r in layers} | {"compute", "communication", "resharding"} <= legend


def test_memory_bars_against_the_limit(plan):
    _mpl()
    ax = plot_plan_memory(plan)
    bars = _container(ax, "memory")
    assert [b.get_height() for b in bars] == pytest.approx([r.memory_bytes for r in plan.layers])
    limit = _line(ax, "limit")
    assert list(limit.get_ydata()) == pytest.approx([plan.memory_limit_bytes] * 2)
    assert list(_line(ax, "peak").get_ydata()) == pytest.approx([plan.memory_bytes_per_device] * 2)
    running = _line(ax, "cumulative").get_ydata()
    assert running[-1] == pytest.approx(sum(r.memory_bytes for r in plan.layers))
    assert ax.get_yscale() == "log"
    lo, hi = ax.get_ylim()
    assert lo < min(b for b in (r.memory_bytes for r in plan.layers) if b > 0) and hi > plan.memory_limit_bytes


def test_history_objective_and_memory_over_limit(plan):
    _mpl()
    ax = plot_history(dataclasses.replace(plan, history=HISTORY, memory_limit_bytes=100.0))
    assert list(_line(ax, "objective").get_ydata()) == pytest.approx([4.0, 3.0, 2.0, 2.5, 2.1])
    (twin,) = [a for a in ax.figure.axes if a is not ax]
    ratio = list(_line(twin, "memory / limit").get_ydata())
    assert ratio[:3] + ratio[4:] == pytest.approx([1.5, 0.9, 0.6, 0.5]) and math.isnan(ratio[3])
    assert list(_line(ax, "does not fit").get_xdata()) == [0]
    boundaries = [ln.get_xdata()[0] for ln in ax.get_lines() if ln.get_gid() == "stage boundary"]
    assert boundaries == [2.5, 3.5]
    assert list(_line(ax, "relaxed").get_xdata()) == [0, 1, 2]
    assert list(_line(ax, "local_search").get_xdata()) == [4]


def test_bare_history_without_a_limit_plots_bytes():
    _mpl()
    ax = plot_history(HISTORY)
    (twin,) = [a for a in ax.figure.axes if a is not ax]
    assert list(_line(twin, "memory").get_ydata())[:3] == [150.0, 90.0, 60.0]
    as_dicts = plot_history([dataclasses.asdict(h) for h in HISTORY], memory_limit_bytes=100.0)
    assert list(_line(as_dicts, "objective").get_ydata()) == pytest.approx([4.0, 3.0, 2.0, 2.5, 2.1])


def test_empty_history_is_a_value_error():
    _mpl()
    with pytest.raises(ValueError, match="no recorded search history"):
        plot_history(())


def test_plot_plan_writes_a_png(plan, tmp_path):
    _mpl()
    out = tmp_path / "plan.png"
    fig = plot_plan(plan, out)
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert len(fig.axes) == 2
    with_history = plot_plan(dataclasses.replace(plan, history=HISTORY), history=True)
    assert len(with_history.axes) == 4  # time, memory, history and its twin
    with pytest.raises(ValueError, match="unknown file type 'xyz'"):
        plot_plan(plan, tmp_path / "plan.xyz")
    with pytest.raises(ValueError, match="no recorded search history"):
        plot_plan(dataclasses.replace(plan, history=()), history=True)


def test_library_without_matplotlib(monkeypatch, plan):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    for draw in (plot_plan_time, plot_plan_memory, plot_history, plot_plan):
        with pytest.raises(ImportError, match=r"shardplan\[plot\]") as e:
            draw(plan)
        assert "\n" not in str(e.value)


# -- the CLI ----------------------------------------------------------------------------


def _one_error_line(capsys, *needles):
    err = capsys.readouterr().err
    assert err.startswith("shardplan: error: ") and err.count("\n") == 1, err
    for n in needles:
        assert n in err, err


def test_cli_plot(plan_file, tmp_path, capsys):
    _mpl()
    out = tmp_path / "out.png"
    assert main(["plot", str(plan_file), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert capsys.readouterr().out == ""


def test_cli_plot_history(plan, tmp_path, capsys):
    _mpl()
    with_history = tmp_path / "h.json"
    dataclasses.replace(plan, history=HISTORY[1:3]).write(with_history)
    out = tmp_path / "h.png"
    assert main(["plot", str(with_history), "-o", str(out), "--history"]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC
    without = tmp_path / "none.json"
    dataclasses.replace(plan, history=()).write(without)
    assert main(["plot", str(without), "-o", str(tmp_path / "n.png"), "--history"]) == 2
    _one_error_line(capsys, "no recorded search history", "shardplan plan")
    assert not (tmp_path / "n.png").exists()


def test_cli_plot_bad_input(plan_file, tmp_path, capsys):
    _mpl()
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["plot", str(bad), "-o", str(tmp_path / "x.png")]) == 2
    _one_error_line(capsys, "malformed JSON")
    assert main(["plot", str(tmp_path / "missing.json"), "-o", str(tmp_path / "x.png")]) == 2
    _one_error_line(capsys, "No such file or directory; expected a plan file")
    assert main(["plot", str(plan_file), "-o", str(tmp_path / "x.xyz")]) == 2
    _one_error_line(capsys, "unknown file type", ".png")
    assert main(["plot", str(plan_file), "-o", str(tmp_path / "no_dir" / "x.png")]) == 2
    _one_error_line(capsys, "cannot write")
    assert main(["plot", str(plan_file)]) == 2  # -o is required
    _one_error_line(capsys, "-o")
    assert not (tmp_path / "x.png").exists()


def test_cli_plot_without_matplotlib(monkeypatch, plan_file, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "x.png"
    assert main(["plot", str(plan_file), "-o", str(out)]) == 2
    _one_error_line(capsys, "shardplan[plot]")
    assert not out.exists()


# -- deep models and the oracle plot ("Trustworthy output": readable plots) -------------------------------


def _long_plan(plan, copies):
    """The short plan's layers repeated ``copies`` times (names made unique): a 100+ layer plan, cheaply."""
    layers = [dataclasses.replace(r, name=f"copy{k}/{r.name}") for k in range(copies) for r in plan.layers]
    return dataclasses.replace(plan, evaluation=dataclasses.replace(plan.evaluation, layers=tuple(layers)))


def _overlapping_labels(ax):
    """Pairs of neighbouring x tick labels whose drawn boxes overlap along x."""
    ax.figure.canvas.draw()
    boxes = [t.get_window_extent() for t in ax.get_xticklabels() if t.get_text()]
    return [(a, b) for a, b in itertools.pairwise(boxes) if a.x1 > b.x0 + 0.5]


@pytest.mark.slow
@pytest.mark.parametrize("copies", [6, 16])  # 198 and 528 layers
def test_deep_plan_plot_is_bounded_and_its_labels_do_not_overlap(plan, copies):
    _mpl()
    from planner.plot import MAX_WIDTH_IN

    deep = _long_plan(plan, copies)
    n = len(deep.layers)
    fig = plot_plan(deep)
    assert fig.get_figwidth() <= MAX_WIDTH_IN
    for ax in fig.axes:
        assert len([p for c in ax.containers for p in c]) in (n, 3 * n)  # every layer keeps its bar(s)
        ticks = [round(t) for t in ax.get_xticks()]
        labels = [t.get_text() for t in ax.get_xticklabels()]
        assert labels == [deep.layers[i].name for i in ticks]  # each label names the layer under it
        step = ticks[1] - ticks[0]
        assert ticks == list(range(0, n, step))
        assert not _overlapping_labels(ax)
        if step > 1:
            assert ax.get_xlabel() == f"{n} layers in plan order (one in {step} named)"
            minor = {round(t) for t in ax.get_xticks(minor=True)}  # matplotlib drops those under a major
            assert minor | set(ticks) == set(range(n))
    if copies == 16:
        assert step > 1  # 528 names cannot all fit 24 inches


def test_short_plan_names_every_layer_without_overlap(plan):
    _mpl()
    ax = plot_plan(plan).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [r.name for r in plan.layers]
    assert not _overlapping_labels(ax) and ax.get_xlabel() == ""


@pytest.fixture(scope="module")
def oracle_report():
    from planner.paradl.report import oracle

    return oracle("resnet50", "abci-v100", [16, 32, 64, 128, 256])


def test_oracle_plot_shows_throughput_and_names_what_it_leaves_out(oracle_report, tmp_path):
    _mpl()
    from planner.cli.oracle import plot_report

    out = tmp_path / "oracle.png"
    fig = plot_report(oracle_report, out)
    assert out.read_bytes()[:8] == PNG_MAGIC
    (ax,) = fig.axes
    assert "samples per second" in ax.get_ylabel() and "batches differ" in ax.get_title()
    rows = oracle_report.rows
    kept = [r for r in rows if r.strategy == "data"]
    assert all(r.limit is None for r in kept) and len({r.batch for r in rows if r.devices == 64}) > 1
    line = _line(ax, "data: iteration")
    assert list(line.get_xdata()) == [r.devices for r in kept]
    assert list(line.get_ydata()) == pytest.approx([r.batch / r.total_s for r in kept])
    assert list(_line(ax, "data: compute").get_ydata()) == pytest.approx([r.batch / r.compute_s for r in kept])
    filt = _line(ax, "filter: iteration")
    past = sorted(r.devices for r in rows if r.strategy == "filter" and r.limit is not None)
    assert past and max(filt.get_xdata()) < min(past)  # not drawn past its limit
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    (note,) = [t for t in legend if t.startswith("filter: left out")]
    assert f"p ≥ {min(past)}" in note and "64 filters" in note
    omitted = {r.strategy for r in rows if r.limit is not None}
    assert "filter" in omitted and {t.split(":")[0] for t in legend if "left out" in t} == omitted
    assert "spatial: left out at every p" in " ".join(legend)  # resnet50 spatial: past its limit everywhere


def test_cli_plot_dpi_cap(plan_file, tmp_path, capsys):
    _mpl()
    from planner.plot import MAX_DPI, check_dpi

    assert MAX_DPI == 1200  # the command line's help says so
    for bad in (0, -1, MAX_DPI + 1, 20000, 1.5, True, "300"):
        with pytest.raises(ValueError, match="dpi must be an integer from 1 to 1200"):
            check_dpi(bad)

    assert main(["plot", str(plan_file), "-o", str(tmp_path / "at_cap.svg"), "--dpi", str(MAX_DPI)]) == 0
    assert (tmp_path / "at_cap.svg").read_bytes().lstrip().startswith(b"<?xml")
    assert main(["plot", str(plan_file), "-o", str(tmp_path / "x.png"), "--dpi", str(MAX_DPI + 1)]) == 2
    _one_error_line(capsys, f"--dpi must be an integer from 1 to {MAX_DPI}", "dpi squared", ".pdf")
    assert not (tmp_path / "x.png").exists()


def test_levers_are_marked_over_their_bars():
    """A plan with ZeRO layers (VGG16-CIFAR-10 within 62 MB, docs/levers.md):
    both per-layer plots mark each of them ``Z<stage>`` over its bar, and
    only them; a plan without levers has no marks."""
    _mpl()
    p = planner.plan("vgg16-cifar10", devices=8, hardware="dgx-a100", batch=64, memory_limit="62MB", levers="zero")
    assert p.zero_stages
    index = {r.name: i for i, r in enumerate(p.layers)}
    want = sorted((index[n], f"Z{z}") for n, z in p.zero_stages.items())
    for plot in (plot_plan_time, plot_plan_memory):
        ax = plot(p)
        marks = sorted((round(t.xy[0]), t.get_text()) for t in ax.texts if t.get_gid() == "lever")
        assert marks == want, plot.__name__
        assert any("ZeRO stage" in t.get_text() for t in ax.get_legend().get_texts())
    plain = plot_plan_memory(dataclasses.replace(p, evaluation=dataclasses.replace(
        p.evaluation, layers=tuple(dataclasses.replace(r, zero_stage=0) for r in p.layers))))
    assert not [t for t in plain.texts if t.get_gid() == "lever"]
