"""Where a benchmark script writes its numbers: one JSON file per run under
``benchmarks/results/`` (``<script>.json`` by default), which
``benchmarks/render_docs.py`` turns into docs/benchmarks.md.

Every file holds the script, the command line that produced it, its mode
(``quick``, ``full``, ...), the date, the jax version, the machine, a
``summary`` (the numbers a claim rests on) and ``rows`` (the table the doc
shows), plus whatever else the script adds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"


def default_path(script: str) -> Path:
    """``benchmarks/results/<script's stem>.json``."""
    return RESULTS_DIR / f"{Path(script).stem}.json"


def add_json_option(parser: argparse.ArgumentParser, script: str, default: Path | None = None,
                    note: str = "") -> None:
    """``--json PATH``: where the run's numbers go (default ``default`` or the script's results file)."""
    path = default_path(script) if default is None else default
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    parser.add_argument("--json", type=Path, default=path, metavar="PATH",
                        help=f"write the numbers of this run to PATH (default {shown}{note})")


def machine() -> dict:
    """What the run ran on: OS, processor, CPU count, Python, the load average at the end of the
    run (other jobs on a shared machine slow its wall times), and JAX's backend where JAX is loaded."""
    out = {"platform": platform.platform(), "processor": platform.machine(), "cpu_count": os.cpu_count(),
           "python": platform.python_version(), "load_average": [round(x, 2) for x in os.getloadavg()]}
    if "jax" in sys.modules:
        import jax

        dev = jax.devices()[0]
        out.update({"jax_backend": dev.platform, "device_kind": dev.device_kind, "device_count": jax.device_count()})
    return out


def _plain(value):
    """JSON-ready: numpy scalars and arrays as Python numbers and lists, tuples as lists,
    paths as text, non-finite floats as None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return _plain(value.tolist())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Path):
        return str(value)
    return value


def command_line(script: str, argv: list[str] | None, env: dict[str, str] | None = None) -> str:
    """``[VAR=value ...] python benchmarks/<script> ARGS`` as the run was started
    (``env``: the environment settings that chose what it measured)."""
    args = sys.argv[1:] if argv is None else list(argv)
    settings = [f"{k}={shlex.quote(v)}" for k, v in (env or {}).items()]
    return " ".join([*settings, shlex.join(["python", f"benchmarks/{Path(script).name}", *args])])


def write_results(path: Path | None, script: str, mode: str, summary: dict, rows: list, argv: list[str] | None = None,
                  env: dict[str, str] | None = None, **extra) -> Path | None:
    """Write one run's numbers to ``path`` atomically (a temporary file in the
    same folder, then renamed); nothing where ``path`` is None. ``env``: the
    environment settings the command line shows before ``python``."""
    if path is None:
        return None
    import jax  # the version the run used (the scripts import it anyway)

    doc = {"script": f"benchmarks/{Path(script).name}", "command": command_line(script, argv, env), "mode": mode,
           "date": datetime.date.today().isoformat(), "jax": jax.__version__, "machine": machine(),
           "summary": summary, "rows": rows, **extra}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)  # as an ordinary file (mkstemp makes it private)
        with os.fdopen(fd, "w") as f:
            json.dump(_plain(doc), f, indent=1, allow_nan=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path
