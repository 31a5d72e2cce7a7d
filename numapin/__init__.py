"""The ``numapin`` command line: one entry point with a subcommand per job."""
