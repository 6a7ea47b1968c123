"""Every test sees 8 CPU devices; set before anything imports jax."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The CLI's persistent compilation cache stays off in tests (no writes to ~/.cache; in-process
# runs share one JAX config); tests/test_cli_latency.py turns it on in a subprocess.
os.environ["SHARDPLAN_CACHE_DIR"] = "off"

import jax  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def devices():
    devs = jax.devices()
    assert len(devs) == 8, f"expected 8 fake CPU devices, got {len(devs)}"
    return devs
