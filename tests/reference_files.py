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
