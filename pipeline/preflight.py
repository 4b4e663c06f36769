"""Checks that run at the start of every stage, before any compute.

They catch what would otherwise fail late: a critic template without its placeholder, a remote
critic without an API key, a cache directory that cannot be written.
"""
from __future__ import annotations

from pathlib import Path

from pipeline.config import Params
from pipeline.errors import ConfigError


def check_inputs(params: Params, root: str | Path = ".") -> None:
    """Raise a DrlcError for any input the run would trip over later."""
    if not params.critic.enabled:
        return
    from pipeline.critic.templates import load_template

    template_path = Path(root) / params.critic.template
    template = load_template(template_path)
    if template.task != params.run.task:
        raise ConfigError(
            f"'critic.template' = {params.critic.template!r} is a {template.task!r} template but "
            f"'run.task' = {params.run.task!r}: use prompts/{params.run.task}.md."
        )
    unknown = sorted(set(params.critic.rewards) - set(template.labels))
    if unknown:
        raise ConfigError(
            f"'critic.rewards' has labels {unknown} that {params.critic.template} does not produce: "
            f"valid labels are {list(template.labels)}."
        )
    if params.critic.endpoint != "local":
        from pipeline.critic.client import api_key_for

        api_key_for(params.critic.endpoint)  # raises on a bad URL or a missing key
