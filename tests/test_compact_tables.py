"""Long per-layer tables stay short ("Trustworthy output": fast, readable
answers): above ``COMPACT_ABOVE`` rows, runs of alike layers of one block are
one summary row. Checked against the JSON rows of the same command: every
layer is accounted for once and in order, a summary row's columns are the
sums of the rows it hides, only plain layers (data parallelism, no
resharding, little communication) are hidden, ``--full`` prints every row,
and short tables are unchanged."""

from __future__ import annotations

import json
import re
import sys

import pytest

from planner._compact import COMPACT_ABOVE, MIN_GROUP, NOTABLE_SHARE, group_rows, label_group
from planner._format import format_bytes, format_count
from planner.cli import main
from planner.models.zoo import get_model

ANSI = re.compile(r"\x1b\[[0-9;]*m")
NUM = r"(\d+\.\d{4})"
BYTES = r"(\d+(?:\.\d)? [kMGTPE]?B)"
COUNT = r"\d+(?:\.\d+)?(?: [kMGTPE])?"
GROUP_NAME = r"… (\d+) layers \((\S+) … (\S+)\)(?:, \d+ blocks like \S+)?"  # the suffix: repeated blocks
COST_GROUP = re.compile(rf"^{GROUP_NAME}\s+(\S+)\s+{NUM}\s+{NUM}\s+{NUM}\s+{BYTES}$")
COST_ROW = re.compile(rf"^(\S+)\s+(\S+)\s+(\S+)\s+{NUM}\s+{NUM}\s+{NUM}\s+{BYTES}$")
SHAPES_AND_COUNTS = rf"([\d×]+)\s+([\d×]+)\s+(?:({COUNT})\s+)?({COUNT})(?:\s+{BYTES})?"
LAYERS_GROUP = re.compile(rf"^{GROUP_NAME}\s+{SHAPES_AND_COUNTS}$")
LAYERS_ROW = re.compile(rf"^(\S+)\s+(\S+)\s+{SHAPES_AND_COUNTS}$")


def _terminal(monkeypatch, capsys, *argv: str) -> str:
    """What ``shardplan ARGV`` prints on a 250-column terminal, colours stripped."""
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(list(argv)) == 0
    return ANSI.sub("", capsys.readouterr().out)


def _json(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _cost_rows(out: str) -> list[tuple]:
    """Table rows: ("group", count, first, last, strategy, compute, comm, reshard, memory) or
    ("row", name, kind, strategy, compute, comm, reshard, memory)."""
    rows = []
    for line in out.splitlines():
        line = line.strip()
        if m := COST_GROUP.match(line):
            rows.append(("group", int(m[1]), m[2], m[3], m[4], float(m[5]), float(m[6]), float(m[7]), m[8]))
        elif m := COST_ROW.match(line):
            rows.append(("row", m[1], m[2], m[3], float(m[4]), float(m[5]), float(m[6]), m[7]))
    return rows


def _check_cost_table(rows: list[tuple], layers: list[dict], iteration_s: float, base: str = "data") -> int:
    """Every JSON layer once, in order; group sums equal the JSON sums; only
    plain layers hidden. Returns the number of groups."""
    i = groups = 0
    for row in rows:
        if row[0] == "group":
            _, count, first, last, strategy, compute, comm, reshard, memory = row
            hidden = layers[i:i + count]
            assert count >= MIN_GROUP and hidden[0]["name"] == first and hidden[-1]["name"] == last, row
            assert strategy == base
            for key, shown in (("compute_s", compute), ("comm_s", comm), ("reshard_s", reshard)):
                assert shown == pytest.approx(sum(r[key] for r in hidden) * 1e3, abs=5.1e-5), (row, key)
            assert memory == format_bytes(sum(r["memory_bytes"] for r in hidden)), row
            for r in hidden:  # the documented rule, from the JSON
                assert r["strategy"] == r["requested_strategy"] == base, r
                reshard = 0.5e-7 if base == "data" else NOTABLE_SHARE * iteration_s
                assert r["reshard_s"] < reshard and r["comm_s"] < NOTABLE_SHARE * iteration_s, r
            i += count
            groups += 1
        else:
            _, name, kind, strategy, compute, *_ = row
            r = layers[i]
            assert (name, kind, strategy.rstrip("*")) == (r["name"], r["kind"], r["strategy"]), row
            assert compute == pytest.approx(r["compute_s"] * 1e3, abs=5.1e-5)
            i += 1
    assert i == len(layers), f"the table accounts for {i} of {len(layers)} layers"
    return groups


@pytest.fixture(scope="module")
def resnet50_plan(tmp_path_factory):
    """``shardplan plan resnet50 --devices 256 --hardware dgx-a100`` on a terminal, and its plan file."""
    import contextlib
    import io

    path = tmp_path_factory.mktemp("compact") / "plan.json"
    buf = io.StringIO()
    buf.isatty = lambda: True  # a terminal (capsys is per test; this fixture is per module)
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(buf):
        mp.setenv("COLUMNS", "250")
        assert main(["plan", "resnet50", "--devices", "256", "--hardware", "dgx-a100", "-o", str(path)]) == 0
    return ANSI.sub("", buf.getvalue()), json.loads(path.read_text()), path


@pytest.mark.slow
def test_plan_table_of_resnet50_is_grouped_and_sums_match_the_json(resnet50_plan):
    out, plan, _ = resnet50_plan
    layers = plan["layers"]
    assert len(layers) > 100
    rows = _cost_rows(out)
    assert len(rows) <= COMPACT_ABOVE < len(layers)
    assert _check_cost_table(rows, layers, plan["iteration_s"]) >= 1
    hidden = sum(r[1] for r in rows if r[0] == "group")
    flat = " ".join(out.split())
    assert f"{hidden} of {len(layers)} layers are grouped" in flat and "--full prints every row" in flat


def test_full_prints_every_row(resnet50_plan, monkeypatch, capsys):
    _, plan, path = resnet50_plan
    out = _terminal(monkeypatch, capsys, "evaluate", "resnet50", "--plan", str(path), "--full")
    rows = _cost_rows(out)
    assert [r[1] for r in rows] == [r["name"] for r in plan["layers"]] and all(r[0] == "row" for r in rows)
    assert "--full" not in out
    data = _json(capsys, "evaluate", "resnet50", "--plan", str(path))  # JSON: never grouped
    assert [r["name"] for r in data["layers"]] == [r["name"] for r in plan["layers"]]


def test_layers_off_data_parallelism_or_resharding_always_show(tmp_path, monkeypatch, capsys):
    """A plan with block layer3/2 on filter parallelism (mesh 4x2): those layers and
    the ones that reshard around them are rows of their own, the rest grouped."""
    g = get_model("resnet50")
    plan = tmp_path / "mixed.json"
    plan.write_text(json.dumps({"model": g.model_name, "graph_fingerprint": g.fingerprint, "layers": [
        {"name": n, "strategy": "filter" if n.startswith("layer3/2/") else "data"} for n in g.names]}))
    argv = ("evaluate", "resnet50", "--devices", "8", "--mesh", "4x2", "--plan", str(plan), "--hardware", "dgx-a100")
    data = _json(capsys, *argv)
    rows = _cost_rows(_terminal(monkeypatch, capsys, *argv))
    assert _check_cost_table(rows, data["layers"], data["iteration_s"]) >= 1
    shown = {r[1] for r in rows if r[0] == "row"}
    special = {r["name"] for r in data["layers"] if r["strategy"] != "data" or r["reshard_s"] > 0}
    assert {n for n in g.names if n.startswith("layer3/2/")} <= special <= shown
    assert any(r["strategy"] == "data" and r["reshard_s"] > 0 for r in data["layers"])  # the test sees both kinds


@pytest.mark.slow
def test_evaluate_strategy_groups_on_that_strategy(monkeypatch, capsys):
    argv = ("evaluate", "resnet152", "--devices", "8", "--mesh", "1x8", "--strategy", "filter", "--hardware",
            "dgx-a100")
    data = _json(capsys, *argv)
    rows = _cost_rows(_terminal(monkeypatch, capsys, *argv))
    assert len(rows) <= COMPACT_ABOVE < len(data["layers"])
    _check_cost_table(rows, data["layers"], data["iteration_s"], base="filter")
    assert any(r["reshard_s"] > 0 for r in data["layers"])  # hidden resharding: under 1% of the iteration each


@pytest.mark.slow
@pytest.mark.parametrize("argv", [
    ("evaluate", "vgg16", "--devices", "8", "--strategy", "data"),
    ("evaluate", "alexnet", "--devices", "8", "--mesh", "4x2", "--strategy", "filter"),
], ids=["vgg16", "alexnet-filter"])
def test_short_tables_are_unchanged(argv, monkeypatch, capsys):
    data = _json(capsys, *argv)
    assert len(data["layers"]) <= COMPACT_ABOVE
    out = _terminal(monkeypatch, capsys, *argv)
    rows = _cost_rows(out)
    assert [r[1] for r in rows] == [r["name"] for r in data["layers"]] and all(r[0] == "row" for r in rows)
    assert "grouped" not in out and "--full" not in out


def _layers_rows(out: str) -> list[tuple]:
    rows = []
    for line in out.splitlines():
        line = line.strip()
        if m := LAYERS_GROUP.match(line):
            rows.append(("group", int(m[1]), m[2], m[3], *m.groups()[3:]))
        elif (m := LAYERS_ROW.match(line)) and m[1] != "total":
            rows.append(("row", m[1], *m.groups()[1:]))
    return rows


def _shape(shape: list[int]) -> str:
    return "×".join(map(str, shape))


@pytest.mark.parametrize("model", ["resnet50", "resnet152"])
def test_layers_table_groups_blocks(model, monkeypatch, capsys):
    report = _json(capsys, "layers", model)
    layers = report["layers"]
    rows = _layers_rows(_terminal(monkeypatch, capsys, "layers", model))
    assert len(rows) <= COMPACT_ABOVE < len(layers)
    i = 0
    for row in rows:
        if row[0] == "group":
            _, count, first, last, inp, out, params, flops, act = row
            hidden = layers[i:i + count]
            assert (hidden[0]["name"], hidden[-1]["name"]) == (first, last)
            # one block: top-level layers, or layers under one top-level name
            assert all("/" not in r["name"] for r in hidden) or len({r["name"].split("/")[0] for r in hidden}) == 1
            assert (inp, out) == (_shape(hidden[0]["input_shape"]), _shape(hidden[-1]["output_shape"]))
            assert flops == format_count(sum(r["flops_forward"] for r in hidden))
            total_params = sum(r["params"] for r in hidden)
            assert params == (format_count(total_params) if total_params else None)
            total_act = sum(r["activation_bytes"] for r in hidden)
            assert act == (format_bytes(total_act) if total_act else None)
            i += count
        else:
            assert row[1] == layers[i]["name"], row
            i += 1
    assert i == len(layers)


def test_layers_full_and_short(monkeypatch, capsys):
    names = [r["name"] for r in _json(capsys, "layers", "resnet50")["layers"]]
    out = _terminal(monkeypatch, capsys, "layers", "resnet50", "--full")
    firsts = [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0] in set(names)]
    assert firsts == names and "…" not in out
    short = [r["name"] for r in _json(capsys, "layers", "vgg16")["layers"]]
    out = _terminal(monkeypatch, capsys, "layers", "vgg16")
    firsts = [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0] in set(short)]
    assert firsts == short and "…" not in out and "--full" not in out


# -- group_rows by hand --------------------------------------------------------------------------------


def _spans(spans):
    return [(s.start, s.stop) for s in spans]


def test_group_rows_by_hand():
    assert _spans(group_rows(["a", "b", "c"], [True] * 3)) == [(0, 1), (1, 2), (2, 3)]  # short: unchanged
    names = ["stem", "s1", "s2", *(f"b{k}/{j}" for k in range(2) for j in range(4)), "head"]
    plain = [True] * len(names)
    plain[5] = False  # b0/2
    # blocks: "" (stem s1 s2), b0 (b0/0 b0/1 | b0/2 | b0/3), b1 (4 rows), "" (head)
    assert _spans(group_rows(names, plain, limit=7)) == [(0, 3), (3, 4), (4, 5), (5, 6), (6, 7), (7, 11), (11, 12)]
    # 7 rows > 3: the top level is the only block: stem … b0/1, b0/2 (not plain), b0/3 … head
    assert _spans(group_rows(names, plain, limit=3)) == [(0, 5), (5, 6), (6, 12)]
    deep = [f"l{k}/{j}/c{i}" for k in range(2) for j in range(3) for i in range(3)]
    assert _spans(group_rows(deep, [True] * 18, limit=6)) == [(0, 3), (3, 6), (6, 9), (9, 12), (12, 15), (15, 18)]
    assert _spans(group_rows(deep, [True] * 18, limit=5)) == [(0, 9), (9, 18)]  # one level up: l0, l1
    assert _spans(group_rows(deep, [True] * 18, limit=1)) == [(0, 18)]  # the top level: one block
    with pytest.raises(ValueError, match="one plain flag per row"):
        group_rows(["a", "b"], [True])


def test_plan_summary_is_compact_like_the_cli_and_full_on_request(resnet50_plan):
    """Plan.summary() groups the same way; each group row's compute is the
    sum of its layers' (from the plan file, to the table's 3 decimals)."""
    from planner import Plan

    _, data, path = resnet50_plan
    p = Plan.read(path)
    by_name = {r["name"]: r for r in data["layers"]}
    order = [r["name"] for r in data["layers"]]
    lines = p.summary().splitlines()
    body = lines[2:lines.index(next(ln for ln in lines if ln.startswith("total")))]
    assert len(body) <= COMPACT_ABOVE < len(order)
    seen = []
    for ln in body:
        m = re.match(GROUP_NAME + r"\s+data\s+([\d.]+)", ln)
        if m:
            n, first, last = int(m[1]), m[2], m[3]
            span = order[order.index(first):order.index(last) + 1]
            assert len(span) == n and all(by_name[x]["strategy"] == "data" for x in span)
            assert float(m[4]) == pytest.approx(sum(by_name[x]["compute_s"] for x in span) * 1e3, abs=1.5e-3)
            seen += span
        else:
            seen.append(ln.split()[0])
    assert seen == order  # every layer once, in order
    assert any("summary(full=True) shows every layer" in ln for ln in lines)
    full = p.summary(full=True).splitlines()
    assert [ln.split()[0] for ln in full[2:2 + len(order)]] == order


def test_repeated_blocks_by_hand():
    """Numbered blocks alike the one before them (same names inside, same
    keys) are one row after that block, shown in full; a block whose key
    differs ends the run, and a run shorter than MIN_GROUP blocks stays."""
    names = ["embed", *(f"blocks/{k}/{x}" for k in range(6) for x in ("norm", "qkv", "add")), "head"]
    keys = [("embed", "data")] + [(x, "filter" if x == "qkv" else "data") for k in range(6)
                                   for x in ("norm", "qkv", "add")] + [("dense", "data")]
    plain = [False] * len(names)
    spans = _spans(group_rows(names, plain, limit=8, keys=keys))
    assert spans == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 19), (19, 20)]  # blocks/0 in full, then blocks/1..5
    assert label_group(names, range(4, 19)) == "… 15 layers (blocks/1/norm … blocks/5/add), 5 blocks like blocks/0"
    keys[3 * 3 + 2] = ("qkv", "channel")  # blocks/3/qkv differs: blocks/1-2 too short a run, blocks/4-5 too
    assert all(len(range(*s)) == 1 for s in _spans(group_rows(names, plain, limit=8, keys=keys)))
    with pytest.raises(ValueError, match="one key per row"):
        group_rows(names, plain, keys=keys[:-1])
