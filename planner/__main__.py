"""``python -m planner``: the ``shardplan`` command line (:mod:`planner.cli`)."""

from planner.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    raise SystemExit(main())
