"""``python -m planner``: the ``shardplan`` command line (:mod:`planner.cli`)."""

__all__: list[str] = []

if __name__ == "__main__":
    from planner._interrupt import exit_on_interrupt

    exit_on_interrupt()  # before the command line's imports: a Ctrl-C during them is one line and exit 130
    from planner.cli import main

    raise SystemExit(main())
