"""The switch-over: the configured critic critiques rounds 1..R, a tagger trained on their answers the rest.

`switch: {R: {last: N, seed, heldout_share}}` in params (docs/tagger.md) makes three DVC stages:

1. ``switch_critic@R``: rounds 1..R in one process, critiqued by ``critic`` as configured (the paid critic),
   from models/base to models/round=R; every round's tables under ``data/<table>/chunk=critic/``;
2. ``switch_distill@R``: a span tagger (:func:`pipeline.audit.distill.distill`) trained on rounds 1..R's
   read critic answers, read from exactly those two folders (rollouts, annotations), into models/tagger=R;
3. ``switch_tagger@R``: rounds R+1..N in one process from models/round=R, critiqued by that tagger
   (:func:`tagger_critic`, drlc's local server), tables under ``data/<table>/chunk=tagger/``.

Why one stage per side and not per round: the tagger stage must depend on rounds 1..R's answers and
nothing later (rounds after R depend on the tagger: a cycle otherwise), and DVC 3.67 cannot interpolate
a list of per-round folders into ``deps``. One folder per side is a fixed number of deps for any R.
Each side runs the chunk engine (:func:`pipeline.steps.chunk.run_rounds`), which writes the tables
per-round stages write, so rounds 1..R are those of a run without the switch.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from pipeline.core.config import CriticParams, Params
from pipeline.core.errors import ConfigError
from pipeline.steps.chunk import chunk_outputs, run_rounds

SIDES = ("critic", "tagger")  # the two sides' names: their stages' suffix and their chunk=<side> folders
TAGGER_MODEL = "drlc-tagger"  # critic.model of the tagger side: unpriced, so its answers cost $0


def tagger_critic(critic: CriticParams, model_dir: str | Path) -> CriticParams:
    """The critic of rounds after R: `critic` with drlc's local server answering from the tagger in model_dir.

    Template, labels, rewards, threshold, alignment, answer format, cache and budgets stay as configured;
    the cache key holds the tagger's model hash (pipeline.steps.critique.critic_model_id).
    """
    return dataclasses.replace(critic, endpoint="local", backend="tagger", model_dir=str(model_dir),
                               model=TAGGER_MODEL)


def tagger_dir(models_dir: str | Path, switch: str) -> Path:
    """models/tagger=R: the folder switch_distill@R writes (models_dir: a run's models folder)."""
    return Path(models_dir) / f"tagger={switch}"


def round_critic(params: Params, key: str, models_dir: str | Path = "models") -> CriticParams:
    """The critic that critiqued round `key`: critic.* as configured, or after a switch-over's R the tagger."""
    switch = params.switch_round()
    if switch is None or key <= switch:
        return params.critic
    return tagger_critic(params.critic, tagger_dir(models_dir, switch))


def side_rounds(params: Params, side: str) -> list[str]:
    """The round keys a side runs: 1..R ('critic') or R+1..last ('tagger')."""
    switch = params.switch_round()
    if switch is None:
        raise ConfigError("params 'switch' is {} (off): the switch stages run only with switch: {R: {last: N}}.")
    if side not in SIDES:
        raise ConfigError(f"--side {side!r}: one of {SIDES}.")
    return [key for key in params.round_keys() if (key <= switch) == (side == "critic")]


def side_outputs(data_dir: str | Path, metrics_dir: str | Path, side: str) -> dict[str, Path]:
    """{table or metrics kind: the side's output folder}, e.g. annotations -> data/annotations/chunk=critic."""
    return chunk_outputs(data_dir, metrics_dir, side)


def side_params(params: Params, side: str, tagger_dir: str | None) -> Params:
    """params with the side's critic as `critic` (the tagger side's: :func:`tagger_critic` of tagger_dir), so the
    stage's preflight checks the critic it calls: a remote critic's API key is not needed after the switch."""
    if (side == "tagger") != (tagger_dir is not None):
        raise ConfigError("--tagger DIR is given to the tagger side (switch_tagger@R) and only to it.")
    return params if side == "critic" else dataclasses.replace(params, critic=tagger_critic(params.critic, tagger_dir))


def run_side(prompt_rows: list[dict], *, params: Params, side: str, policy_dir: str, reference_dir: str,
             out_dir: str, data_dir: str | Path, metrics_dir: str | Path, device="cpu", log=print) -> list[dict]:
    """Run one side's rounds with params.critic (:func:`side_params` gives the tagger side's). Returns the
    critique metrics."""
    return run_rounds(prompt_rows, params=params, keys=side_rounds(params, side), critic=params.critic,
                      name=f"switch_{side}", policy_dir=policy_dir, reference_dir=reference_dir, out_dir=out_dir,
                      folders=side_outputs(data_dir, metrics_dir, side), device=device, log=log)
