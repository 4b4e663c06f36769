"""`python -m pipeline` is the `drlc` command."""
from pipeline.commands.cli import main

main()
