"""The package version, single source for pyproject.toml and plan files."""

__version__ = "0.1.0"
