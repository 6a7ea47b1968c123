"""Where the tests find ``shared/reference`` (the papers' data files): beside
the repository (``../shared``, as CI lays it out) or inside it (``shared/``,
as on the device machine). Tests that need it skip with this reason when it
is absent."""

from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]


def reference_dir() -> Path:
    for root in (_REPO.parent / "shared" / "reference", _REPO / "shared" / "reference"):
        if root.is_dir():
            return root
    return _REPO.parent / "shared" / "reference"


PARADL_MODELS = reference_dir() / "paradl" / "models"
MISSING_REASON = f"ParaDL model files not found at {PARADL_MODELS} (shared/ beside or inside the repo)"

# A four-layer ParaDL network written by hand (conv, relu, max-pool, dense on 3x8x8 inputs), for tests
# of the .net reader and of the command line.
TINY_NET = """Dataset|Tiny
Input|100x3x8x8
Model|tiny
CONV1|3x8x8|3x4x3x3|4x8x8|0.5
RELU|4x8x8|4x4x0x0|4x8x8|0
MPOOL|4x8x8|0x0x2x2|4x4x4|0
FC|4x4x4|4x10x4x4|10x1x1|0
"""
