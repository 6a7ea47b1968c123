"""The CLI keeps a cache in a user folder (SHARDPLAN_CACHE_DIR, default
~/.cache/shardplan): JAX's persistent compilation cache in its ``jax``
folder, so a second run compiles nothing, and cost tables in
``cost-tables``, so a second run does not build them again; "off" keeps it
off. Times are benchmarks/cli_latency.py's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.cli import cache_dir, compilation_cache_dir, cost_table_cache_dir

ROOT = Path(__file__).resolve().parents[1]


def test_cache_folder_rules(monkeypatch, tmp_path):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)  # tests/conftest.py sets one
    monkeypatch.setenv("SHARDPLAN_CACHE_DIR", str(tmp_path / "c"))
    assert (cache_dir(), compilation_cache_dir(), cost_table_cache_dir()) == (
        tmp_path / "c", tmp_path / "c" / "jax", tmp_path / "c" / "cost-tables")
    monkeypatch.setenv("SHARDPLAN_CACHE_DIR", "off")
    assert (cache_dir(), compilation_cache_dir(), cost_table_cache_dir()) == (None, None, None)
    monkeypatch.delenv("SHARDPLAN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
    assert compilation_cache_dir() is None  # JAX's own setting wins
    assert cost_table_cache_dir() == tmp_path / "xdg" / "shardplan" / "cost-tables"
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    assert compilation_cache_dir() == tmp_path / "xdg" / "shardplan" / "jax"


@pytest.mark.slow
def test_a_cli_run_fills_the_cache_and_off_writes_nothing(tmp_path):
    cmd = [sys.executable, "-m", "planner", "plan", "vgg16-cifar10", "--devices", "8", "--json"]
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "XLA_FLAGS")}
    cache = tmp_path / "cache"
    r = subprocess.run(cmd, env=dict(env, SHARDPLAN_CACHE_DIR=str(cache)), capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    first = sorted(str(p.relative_to(cache)) for p in cache.rglob("*"))
    assert any(p.startswith("jax/") for p in first) and any(p.startswith("cost-tables/") for p in first)
    r2 = subprocess.run(cmd, env=dict(env, SHARDPLAN_CACHE_DIR=str(cache)), capture_output=True, text=True, cwd=ROOT,
                        timeout=300)
    assert r2.returncode == 0 and sorted(str(p.relative_to(cache)) for p in cache.rglob("*")) == first  # all read
    assert _without_timing(r2.stdout) == _without_timing(r.stdout)  # the same plan from the cache
    home = tmp_path / "home"
    r = subprocess.run(cmd, env=dict(env, SHARDPLAN_CACHE_DIR="off", XDG_CACHE_HOME=str(home)), capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0 and not home.exists()


def _without_timing(plan_json: str) -> dict:
    import json

    data = json.loads(plan_json)
    del data["seconds"]  # the search's wall time
    return data
