"""`python -m pipeline` is the `drlc` command."""
from pipeline.cli import main

main()
