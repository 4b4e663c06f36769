"""What a person runs: the `drlc` command line and the commands behind it (estimate, replay, report, rounds)."""
