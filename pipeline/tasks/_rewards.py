"""A task file's rewards, declared as TRL declares them, and their weighted total.

The file names its rewards (TRL's ``reward_funcs`` and ``reward_weights``)::

    REWARDS = [coverage, brevity]     # functions or callable objects, here or imported from a tasks/ helper
    REWARD_WEIGHTS = [1.0, "brevity_weight"]  # optional (1.0 each); a name: that key of score.settings

or defines one function ``reward`` (then ``REWARDS = [reward]``). Nothing else of the file is a
reward. Each is called on a batch as ``f(prompts, completions, **columns)``; one that names its
parameters gets just those (a prompt column, or a setting of ``score.settings``), one with
``**kwargs`` gets every column and setting. A reward returns one value per completion:

- a number;
- None: the reward does not apply to that prompt (multi-task data); it is left out of that
  response's weighted total, as TRL does; a response no reward applies to is an error;
- a dict (verl's ``compute_score``): its ``score`` is the value, its other numbers are stored
  beside it as ``<reward>.<key>`` (the scores table's ``rewards`` map).

``async def`` rewards (and rewards that return an awaitable) run concurrently, in one event loop.

A reward that needs a model names it as a parameter, and the file says how to load it::

    MODELS = {"judge": load_judge}    # def load_judge(device): import transformers ...; return the model

drlc calls the loader once per stage, with ``run.device`` resolved, the first time a reward that
names ``judge`` scores: only the stages that score (score, evaluate, chunk) load it, and importing
the file (prepare, critique) loads nothing.
"""
from __future__ import annotations

import asyncio
import inspect
import math
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import ConfigError, RewardError
from pipeline.core.user_code import where

DICT_VALUE = "score"  # the key of a dict reward's value (verl's compute_score convention)


@dataclass(frozen=True)
class Reward:
    name: str
    function: object
    weight: float

    def required(self) -> set[str]:
        """The keyword parameters it names without a default (a column or a setting it cannot do without)."""
        parameters = list(inspect.signature(self.function).parameters.values())[2:]
        return {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                and p.default is p.empty}

    def arguments(self) -> tuple[set[str], bool]:
        """(the keyword parameters it names beyond prompts and completions, whether it takes **kwargs)."""
        parameters = list(inspect.signature(self.function).parameters.values())
        named = {p.name for p in parameters[2:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        return named, any(p.kind is p.VAR_KEYWORD for p in parameters)


def declared_rewards(module, path: Path, settings: dict | None = None) -> list[Reward]:
    """The file's REWARDS with their REWARD_WEIGHTS (a name read from `settings`: score.settings), or its function
    `reward`; ConfigError naming the fix."""
    functions = getattr(module, "REWARDS", None)
    if functions is None:
        function = getattr(module, "reward", None)
        if not callable(function):
            public = sorted(n for n, f in vars(module).items() if inspect.isfunction(f) and not n.startswith("_"))
            raise ConfigError(f"'score.scorer' = 'reward': {path} declares no reward (its functions: {public}): define "
                              f"def reward(prompts, completions, **columns), or list them: REWARDS = [f, g].")
        functions = [function]
    if not isinstance(functions, (list, tuple)) or not functions or not all(callable(f) for f in functions):
        raise ConfigError(f"REWARDS of {path} = {functions!r}: give a non-empty list of functions "
                          f"f(prompts, completions, **columns).")
    weights = getattr(module, "REWARD_WEIGHTS", None) or [1.0] * len(functions)
    if len(weights) != len(functions) or not all(_is_number(w) or isinstance(w, str) for w in weights):
        raise ConfigError(f"REWARD_WEIGHTS of {path} = {weights!r}: give one number (or score.settings key) per "
                          f"reward of REWARDS ({len(functions)}).")
    settings = dict(settings or {})
    unset = [w for w in weights if isinstance(w, str) and not _is_number(settings.get(w))]
    if unset:
        raise ConfigError(f"REWARD_WEIGHTS of {path} names {unset[0]!r}, but 'score.settings.{unset[0]}' = "
                          f"{settings.get(unset[0])!r}: set it to a number in params.yaml (score.settings).")
    weights = [settings[w] if isinstance(w, str) else w for w in weights]
    names = [getattr(f, "__name__", type(f).__name__) for f in functions]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"REWARDS of {path} names {twice} twice: give each reward its own function name.")
    return [Reward(n, f, float(w)) for n, f, w in zip(names, functions, weights)]


def call_rewards(rewards: list[Reward], prompts: list[str], completions: list[str], columns: dict[str, list], *,
                 path: Path, settings: dict | None = None, models=None) -> dict[str, list]:
    """{reward name: what it returned} for one batch; async rewards awaited together. models: the file's MODELS
    as a mapping that loads each on first use (a reward gets the ones it names)."""
    settings, models = dict(settings or {}), models if models is not None else {}
    results, pending = {}, {}
    for reward in rewards:
        try:
            value = reward.function(prompts, completions, **_inputs(reward, columns, settings, models, path))
        except RewardError:
            raise
        except Exception as error:
            raise _failed(reward, error, len(completions), path) from error
        (pending if inspect.isawaitable(value) else results)[reward.name] = value
    if pending:
        async def gather():
            return await asyncio.gather(*pending.values(), return_exceptions=True)

        for (name, value), reward in zip(zip(pending, asyncio.run(gather())), [r for r in rewards if r.name in pending]):
            if isinstance(value, BaseException):
                raise _failed(reward, value, len(completions), path) from value
            results[name] = value
    return {reward.name: results[reward.name] for reward in rewards}


def _inputs(reward: Reward, columns: dict[str, list], settings: dict, models, path: Path) -> dict:
    """The keyword arguments of `reward`: every column and setting (**kwargs), else the ones it names; and each
    model of MODELS it names (loaded on first use)."""
    named, takes_all = reward.arguments()
    available = {**columns, **settings, **{name: models[name] for name in named if name in models}}
    if takes_all:
        return available
    missing = sorted(named - set(available))
    if missing:
        raise RewardError(f"reward {reward.name} ({path}) reads {missing}, which neither the prompts' columns "
                          f"{sorted(columns)} nor score.settings {sorted(settings)} nor MODELS supply: return them "
                          f"from prompt(record), set them in score.settings, or give the parameter a default.")
    return {name: available[name] for name in named if name in available}


def _failed(reward: Reward, error: BaseException, n: int, path: Path) -> RewardError:
    return RewardError(f"reward {reward.name} raised on {n} responses{where(error, path)}: "
                       f"{type(error).__name__}: {error}")


def weighted_totals(rewards: list[Reward], values: dict[str, list], *, ids: list[str],
                    who: str) -> tuple[list[float], list[dict[str, float | None]]]:
    """(Σ weight × value over the rewards that apply, per response; per response {name: value, "name.key": extra})."""
    terms: list[dict] = [{} for _ in ids]
    for reward in rewards:
        returned = values[reward.name]
        if isinstance(returned, (str, bytes, dict)) or not hasattr(returned, "__len__"):
            raise RewardError(f"{who}: reward {reward.name} returned {type(returned).__name__}, not a list (one "
                              f"value per completion).")
        if len(returned) != len(ids):
            raise RewardError(f"{who}: reward {reward.name} returned {len(returned)} values for {len(ids)} responses "
                              f"({ids[0]} to {ids[-1]}): return one value per completion, in order.")
        for row, response_id, value in zip(terms, ids, returned):
            row.update(_term(reward.name, value, response_id, who))
    totals = []
    for row, response_id in zip(terms, ids):
        applied = [(r.weight, row[r.name]) for r in rewards if row[r.name] is not None]
        if not applied:
            raise RewardError(f"{who}: no reward applies to response {response_id} (each of "
                              f"{[r.name for r in rewards]} returned None): let one score every prompt.")
        totals.append(sum(weight * value for weight, value in applied))
    return totals, terms


def _term(name: str, value, response_id: str, who: str) -> dict[str, float | None]:
    """{name: value} for one response, with a dict's extra numbers as {name.key: number}."""
    extras = {}
    if isinstance(value, dict):
        if DICT_VALUE not in value:
            raise RewardError(f"{who}: reward {name} returned a dict without {DICT_VALUE!r} for response "
                              f"{response_id} ({sorted(value)}): put the reward in {DICT_VALUE!r}, extra numbers beside it.")
        extras = {f"{name}.{key}": _number(v, f"{name}.{key}", response_id, who) for key, v in value.items()
                  if key != DICT_VALUE}
        value = value[DICT_VALUE]
    return {name: None if value is None else _number(value, name, response_id, who), **extras}


def _number(value, name: str, response_id: str, who: str) -> float:
    if not _is_number(value) or not math.isfinite(float(value)):
        raise RewardError(f"{who}: reward {name} returned {value!r} ({type(value).__name__}) for response "
                          f"{response_id}: return a finite float (or None where it does not apply).")
    return float(value)


def _is_number(value) -> bool:
    """A real number: int, float, a NumPy or torch scalar; not bool, str or None."""
    if isinstance(value, (bool, str, bytes)) or value is None:
        return False
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True
