"""The CLI keeps JAX's persistent compilation cache in a user folder
(SHARDPLAN_CACHE_DIR, default ~/.cache/shardplan/jax), so a second run
compiles nothing; "off" keeps it off. Times are benchmarks/cli_latency.py's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.cli import compilation_cache_dir

ROOT = Path(__file__).resolve().parents[1]


def test_cache_folder_rules(monkeypatch, tmp_path):
    monkeypatch.setenv("SHARDPLAN_CACHE_DIR", str(tmp_path / "c"))
    assert compilation_cache_dir() == tmp_path / "c"
    monkeypatch.setenv("SHARDPLAN_CACHE_DIR", "off")
    assert compilation_cache_dir() is None
    monkeypatch.delenv("SHARDPLAN_CACHE_DIR")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax"))
    assert compilation_cache_dir() is None  # JAX's own setting wins
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compilation_cache_dir() == tmp_path / "xdg" / "shardplan" / "jax"


@pytest.mark.slow
def test_a_cli_run_fills_the_cache_and_off_writes_nothing(tmp_path):
    cmd = [sys.executable, "-m", "planner", "plan", "vgg16-cifar10", "--devices", "8", "--json"]
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR", "XLA_FLAGS")}
    cache = tmp_path / "cache"
    r = subprocess.run(cmd, env=dict(env, SHARDPLAN_CACHE_DIR=str(cache)), capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    first = sorted(p.name for p in cache.iterdir())
    assert first  # compiled programs were written
    r = subprocess.run(cmd, env=dict(env, SHARDPLAN_CACHE_DIR=str(cache)), capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0 and sorted(p.name for p in cache.iterdir()) == first  # read, nothing new compiled
    home = tmp_path / "home"
    r = subprocess.run(cmd, env=dict(env, SHARDPLAN_CACHE_DIR="off", XDG_CACHE_HOME=str(home)), capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0 and not home.exists()
