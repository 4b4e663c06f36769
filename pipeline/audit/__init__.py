"""The critic audit: a critic's spans against human-labelled spans (`drlc critic eval`), with span metrics and baselines."""
