"""Checks that run at the start of a stage, before any compute, and in `drlc check`.

They catch what would otherwise fail late: a critic template without its placeholder, a remote
critic without an API key, a cache directory that cannot be written.
"""
from __future__ import annotations

import os
from pathlib import Path

from pipeline.core.config import Params
from pipeline.core.errors import CacheError, ConfigError
from pipeline.model.gguf import is_gguf_spec, resolve_gguf
from pipeline.tasks import check_params, get_task, task_label


def check_inputs(params: Params, root: str | Path = ".") -> Params:
    """Raise a DrlcError for any input the run would trip over later: the task's and the critic's."""
    return check_critic(check_params(params), root)


def check_critic(params: Params, root: str | Path = ".") -> Params:
    """The critic's inputs: its template (task, labels, placeholders), its cache folder, its API key.

    Only the stages that call the critic (critique, chunk) run it, so the others never import the critic.
    """
    if not params.critic.enabled:
        return params
    from pipeline.critic.templates import load_template

    template_path = Path(root) / params.critic.template
    task = get_task(params.run.task)
    template = load_template(template_path, task=task_label(params.run.task), labels=params.critic.labels,
                             fields=task.critic_fields)
    if template.task not in (params.run.task, task_label(params.run.task)):
        fix = f"prompts/{params.run.task}.md" if params.run.task == task_label(params.run.task) else \
            f"a template whose front matter says task: {task_label(params.run.task)}"
        raise ConfigError(
            f"'critic.template' = {params.critic.template!r} is a {template.task!r} template but "
            f"'run.task' = {params.run.task!r}: use {fix}."
        )
    undeclared = [label for label in template.labels if getattr(task, "LABELS", None) and label not in task.LABELS]
    if undeclared:
        raise ConfigError(f"'critic.template' = {params.critic.template!r} has labels {undeclared} that "
                          f"{task.path} does not declare (LABELS = {list(task.LABELS)}): add them to LABELS, "
                          f"or fix the template's front matter.")
    if params.critic.answer_format != "text":  # the longest constrained answer must close within max_tokens
        from pipeline.critic.constraint import answer_bound

        answer_bound(template.labels, params.critic.max_tokens)
    unknown = sorted(set(params.critic.rewards) - set(template.labels))
    if unknown:
        raise ConfigError(
            f"'critic.rewards' has labels {unknown} that {params.critic.template} does not produce: "
            f"valid labels are {list(template.labels)}."
        )
    if params.critic.endpoint == "local" and params.critic.backend == "lexicon" and hasattr(task, "path"):
        raise ConfigError(f"'critic.backend' = 'lexicon' knows the built-in tasks only, not {params.run.task!r}: use "
                          f"rules (a critic(query, response) function in your task file), hf (a local model) or "
                          f"tagger, or set critic.endpoint to a server.")
    if params.critic.endpoint == "local" and params.critic.backend == "rules" and \
            not (params.critic.model_dir and (Path(root) / params.critic.model_dir).is_file()):
        raise ConfigError(f"'critic.backend' = 'rules' reads a critic(query, response) function from "
                          f"'critic.model_dir' = {params.critic.model_dir!r}, which is not a file: set it to your "
                          f"task file (e.g. {params.run.task}).")
    if is_gguf_spec(params.critic.model_dir):
        resolve_gguf(params.critic.model_dir, key="critic.model_dir")
    check_cache_dir(params.critic.cache_dir, root)
    if params.critic.endpoint != "local":
        from pipeline.critic.client import api_key_for

        api_key_for(params.critic.endpoint)  # raises on a bad URL or a missing key
    return params


def check_cache_dir(cache_dir: str | Path, root: str | Path = ".") -> None:
    """Raise CacheError unless cache_dir is, or can be created as, a writable directory.

    Creates nothing: the nearest existing path up from cache_dir must be a directory this
    process may write (a regular file on the way, e.g. `<file>/sub`, fails even for root).
    """
    existing = Path(root) / cache_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    problem = ("is not a directory" if not existing.is_dir()
               else "is not writable" if not os.access(existing, os.W_OK | os.X_OK) else "")
    if problem:
        raise CacheError(f"'critic.cache_dir' = {str(cache_dir)!r} cannot be created or written: "
                         f"{str(existing)!r} {problem}; set critic.cache_dir to a writable directory.")
