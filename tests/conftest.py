"""Every test sees 8 CPU devices; set before anything imports jax."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The CLI's persistent compilation cache stays off in tests (no writes to ~/.cache; in-process
# runs share one JAX config); tests/test_cli_latency.py turns it on in a subprocess.
os.environ["SHARDPLAN_CACHE_DIR"] = "off"
# JAX's own persistent compilation cache, shared by the xdist workers (they inherit the
# controller's environment) and the subprocesses tests start: many tests compile the same
# program (a plan's training step for shard and again for validate, the same model's cost
# table), and a hit skips XLA's compile. Every program is cached, however fast it compiled.
# A cached executable reports the same memory_analysis and HLO text (checked when this was
# added: planner.validate of one plan, cold and warm, gave identical rows).
_CACHE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".pytest_cache", "jax")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def devices():
    devs = jax.devices()
    assert len(devs) == 8, f"expected 8 fake CPU devices, got {len(devs)}"
    return devs
