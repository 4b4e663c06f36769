"""The exceptions drlc raises for problems a user can fix.

Every message names the bad thing, the bad value and what would be valid. The CLI and the
stage scripts print ``str(error)`` as one line on stderr and exit with code 2; nothing else
in drlc catches these. ``assert`` is kept for internal invariants only.
"""


class DrlcError(Exception):
    """Base class: an input or environment problem the user can act on."""


class ConfigError(DrlcError):
    """A parameter in params.yaml, a config file or an override is unknown, mistyped or out of range."""


class DataError(DrlcError):
    """An input data file or table is missing, empty or lacks a needed field."""


class TemplateError(DrlcError):
    """A critic prompt template is missing a placeholder or its output-format section."""


class CacheError(DrlcError):
    """The critic cache directory cannot be opened or written."""


class CriticError(DrlcError):
    """The critic endpoint is misconfigured (bad URL, missing API key, unknown backend)."""


class StoreError(DrlcError):
    """A Parquet table is missing, unreadable or has the wrong columns."""


class RewardError(DrlcError):
    """An environment reward raised, or returned values that do not match its responses one for one."""


class PPOInputError(DrlcError):
    """A PPO batch is malformed: lengths that do not match, non-finite rewards, bad batch sizes."""


def exit_on_error(main):
    """Run `main()`; a DrlcError becomes one line on stderr and exit code 2 (no traceback)."""
    import sys

    try:
        return main()
    except DrlcError as error:
        print(f"drlc: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
