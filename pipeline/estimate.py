"""`drlc estimate CONFIG`: check a params file offline and say what a run would do and cost.

Nothing is downloaded, trained or sent. The report has four parts:

- the resolved parameters (every key, defaults filled in; the rounds block summarised);
- the stages `dvc repro` would run (dvc.yaml's stages, `foreach` expanded over the rounds or chunks);
- the models and data sets the run would load, each marked local, a hub id (with whether the
  Hugging Face cache already holds it) or a missing local path;
- the critic: calls per round and in total, tokens per call and the cost at `critic.prices`.

Critic calls. A response is critiqued when its environment reward is <= critic.threshold, so
the upper bound is rollout.batch_size x rounds. When the threshold is at or above the largest
reward the scorer can give (`reward_maximum`), every response is critiqued and the bound is the
expectation. Otherwise the share is unknown before the run: pass `--critique-rate R`, or
`--data DIR` to measure it from a finished run's scores tables; without either the report gives
the upper bound and says so.

Tokens. Prompt tokens = the template's system and user text with the placeholders filled by
nothing, plus the response (the mean of rollout.min_new_tokens and max_new_tokens), plus the
document for summarization (`--document-tokens`), plus CHAT_OVERHEAD_TOKENS. Completion tokens
= one "Label: " line per template label plus half the response in quoted spans, capped at
critic.max_tokens; the cost upper bound prices every answer at critic.max_tokens. Text is
counted with the base model's tokenizer when base.model is a local folder, else as chars / 4.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline.config import Params, load_params
from pipeline.errors import ConfigError, DrlcError

CHARS_PER_TOKEN = 4  # the usual rule of thumb for English BPE text
CHAT_OVERHEAD_TOKENS = 7  # role markers of two chat messages and the reply priming (approximate)
# Mean TL;DR post of ../shared/data/summarization/tldr_oai_ppo1b/oai1b.csv (1,945 posts): 1,408 chars.
DEFAULT_DOCUMENT_TOKENS = 352


@dataclass(frozen=True)
class CriticEstimate:
    """Expected critic traffic and cost of a whole run (all rounds)."""

    rounds: int
    batch_size: int
    critique_rate: float
    rate_source: str
    calls_per_round: float
    calls_upper_bound: int
    prompt_tokens: int  # per call
    completion_tokens: int  # per call, estimated
    completion_tokens_max: int  # per call, critic.max_tokens
    usd_per_call: float
    usd_per_call_max: float
    priced: bool
    token_counter: str

    @property
    def calls(self) -> float:
        return self.calls_per_round * self.rounds

    @property
    def usd(self) -> float:
        return self.calls * self.usd_per_call

    @property
    def usd_upper_bound(self) -> float:
        return self.calls_upper_bound * self.usd_per_call_max


def reward_maximum(params: Params) -> float | None:
    """The largest environment reward the configured scorer can give, or None when unbounded.

    The task module's reward_range says it (pipeline/tasks/<task>.py, from the reward's RANGE).
    """
    from pipeline.tasks import get_task

    return get_task(params.run.task).reward_range(params.score)[1]


def measured_critique_rate(params: Params, data_dir: str | Path) -> float | None:
    """Share of scored responses with env_reward <= critic.threshold in DIR/scores, or None if none."""
    from pipeline import store

    rows = [row for part in store.partition_files(data_dir, "scores") for row in store.read_table(part, "scores")]
    if not rows:
        return None
    return sum(float(r["env_reward"]) <= params.critic.threshold for r in rows) / len(rows)


def critique_rate(params: Params, *, stated: float | None = None, measured: float | None = None) -> tuple[float, str]:
    """(share of responses critiqued, how it was obtained); see the module docstring."""
    if not params.critic.enabled:
        return 0.0, "critic disabled: no calls"
    top = reward_maximum(params)
    if top is not None and params.critic.threshold >= top:
        return 1.0, f"threshold {params.critic.threshold:g} >= the scorer's maximum {top:g}: every response"
    if stated is not None:
        if not 0.0 <= stated <= 1.0:
            raise ConfigError(f"--critique-rate = {stated} is not a share: give a number in [0, 1].")
        return stated, "stated with --critique-rate"
    if measured is not None:
        return measured, "measured from the scores tables under --data"
    return 1.0, (f"UPPER BOUND: threshold {params.critic.threshold:g} is selective and the share below it is "
                 "unknown offline; pass --critique-rate R or --data DIR of a finished run")


def token_counter(params: Params, root: str | Path = "."):
    """(count(text) -> tokens, description): the base tokenizer when base.model is a local folder."""
    model = params.base.model
    if model and (Path(root) / model).is_dir():
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(Path(root) / model))
            return (lambda text: len(tokenizer.encode(text))), f"the tokenizer of {model}"
        except (OSError, ValueError):
            pass
    return (lambda text: math.ceil(len(text) / CHARS_PER_TOKEN)), f"characters / {CHARS_PER_TOKEN}"


def mean_response_tokens(params: Params) -> float:
    low = params.rollout.min_new_tokens or params.rollout.max_new_tokens
    return (low + params.rollout.max_new_tokens) / 2


def estimate_critic(params: Params, *, root: str | Path = ".", stated_rate: float | None = None,
                    measured_rate: float | None = None,
                    document_tokens: int = DEFAULT_DOCUMENT_TOKENS) -> CriticEstimate:
    """Calls, tokens and dollars of the run's critic; see the module docstring for the counting."""
    from pipeline.critic.templates import load_template

    rate, source = critique_rate(params, stated=stated_rate, measured=measured_rate)
    count, counter_name = token_counter(params, root)
    template = load_template(Path(root) / params.critic.template, task=params.run.task,
                             labels=params.critic.labels)
    response = mean_response_tokens(params)
    empty = {name: "" for name in template.placeholders}
    scaffold = sum(count(m["content"]) for m in template.render(empty))
    document = document_tokens if "document" in template.placeholders else 0
    prompt_tokens = round(scaffold + response + document + CHAT_OVERHEAD_TOKENS)
    label_lines = sum(count(f"{label.capitalize()}: none\n") for label in template.labels)
    completion = min(round(label_lines + response / 2), params.critic.max_tokens)
    price = params.critic.prices.get(params.critic.model)
    usd = lambda p, c: (p * price[0] + c * price[1]) / 1e6 if price else 0.0  # noqa: E731
    rounds, batch = len(params.rounds), params.rollout.batch_size
    return CriticEstimate(
        rounds=rounds, batch_size=batch, critique_rate=rate, rate_source=source,
        calls_per_round=rate * batch, calls_upper_bound=batch * rounds if params.critic.enabled else 0,
        prompt_tokens=prompt_tokens, completion_tokens=completion,
        completion_tokens_max=params.critic.max_tokens, usd_per_call=usd(prompt_tokens, completion),
        usd_per_call_max=usd(prompt_tokens, params.critic.max_tokens), priced=price is not None,
        token_counter=counter_name)


def planned_stages(params: Params, dvc_file: str | Path = "dvc.yaml") -> list[str]:
    """dvc.yaml's stage names with `foreach` stages expanded (name@key): over the rounds, or over the
    chunks for `foreach: ${chunks}` (per-round stages have no rounds then: `rounds: {}`)."""
    path = Path(dvc_file)
    if not path.is_file():
        return []
    stages = (yaml.safe_load(path.read_text()) or {}).get("stages", {})
    keys = {"${rounds}": [] if params.chunks else params.round_keys(), "${chunks}": sorted(params.chunks)}
    names = []
    for name, spec in stages.items():
        expanded = keys.get(spec["foreach"], params.round_keys()) if "foreach" in spec else None
        names += [name] if expanded is None else [f"{name}@{key}" for key in expanded]
    return names


def _hub_cached(repo_id: str, kind: str) -> bool:
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
    return (hub.expanduser() / f"{kind}s--{repo_id.replace('/', '--')}").is_dir()


def source_status(name: str, *, kind: str, root: str | Path = ".") -> str:
    """'local', 'hub (cached)', 'hub: NOT LOCAL, needs a download' or 'MISSING local path'."""
    if name.startswith("hub:"):
        name, kind = name[len("hub:"):].partition(":")[0], "dataset"  # hub:<id>[:<split>]
    elif ":" in name and (Path(root) / name.rpartition(":")[0]).exists():
        return "local"  # a saved DatasetDict folder with a split: DIR:<split>
    if (Path(root) / name).exists():
        return "local"
    looks_like_path = name.startswith((".", "/", "~")) or name.count("/") > 1 or "." in Path(name).name
    if looks_like_path:
        return "MISSING local path"
    return "hub (cached)" if _hub_cached(name, kind) else "hub: NOT LOCAL, needs a download"


def inputs_of(params: Params) -> list[tuple[str, str, str]]:
    """(role, name, kind) of every model and data set the run loads; kind is 'model' or 'dataset'."""
    p = params
    items = [("base model", p.base.model or "(tiny GPT-2 built from base.*)", "built" if not p.base.model else "model")]
    if p.world.source != "world":
        items.append(("world.source", p.world.source, "dataset"))
    if p.score.model:
        items.append((f"score.model ({p.score.scorer})", p.score.model, "model"))
    if p.critic.enabled and p.critic.endpoint == "local" and p.critic.backend == "hf":
        items.append(("critic (hf backend)", p.critic.model_dir or "(critic.model_dir unset)",
                      "built" if p.critic.model_dir in (None, "base") else "model"))
    if p.evaluate.fluency_model != "base":
        items.append(("evaluate.fluency_model", p.evaluate.fluency_model, "model"))
    if p.evaluate.reward_model:
        items.append(("evaluate.reward_model", p.evaluate.reward_model, "model"))
    items += [("evaluate.prompts", s, "dataset") for s in p.evaluate.prompts if s != "world"]
    if p.evaluate.classifier_data != "world" and p.run.task == "sentiment":
        items.append(("evaluate.classifier_data", p.evaluate.classifier_data, "dataset"))
    return items


def remote_scorer_calls(params: Params, root: str | Path = ".") -> tuple[int, int] | None:
    """(training calls, evaluation calls) of a remote scorer (Perspective), or None for local scorers.

    Evaluation scores samples_per_prompt samples of every prompt for the base and the policy.
    A prompt file that is not local counts 0 prompts (unknown offline).
    """
    if params.score.scorer != "perspective":
        return None
    prompts = 0
    for source in params.evaluate.prompts:
        path = Path(root) / source
        n = params.world.n_eval_prompts if source == "world" else (
            sum(1 for line in path.open() if line.strip()) if path.is_file() else 0)
        prompts += min(n, params.evaluate.n_prompts or n)
    training = params.rollout.batch_size * len(params.rounds)
    return training, 2 * prompts * params.evaluate.samples_per_prompt


def check_offline(params: Params, *, root: str | Path = ".", processes: int = 1) -> list[str]:
    """Raise for what would fail at run time and can be known now; return warnings (strings)."""
    from pipeline.preflight import check_inputs
    from pipeline.replay import without_remote

    check_inputs(without_remote(params), root)  # template task and labels, cache dir; the API key is a warning below
    ppo = params.ppo  # rollout.batch_size vs the minibatch is checked at load (pipeline/config.py)
    if ppo.mini_batch_size % processes:
        raise ConfigError(f"'ppo.mini_batch_size' = {ppo.mini_batch_size} is not divisible by --processes "
                          f"{processes}: each process takes an equal share of every minibatch.")
    warnings = []
    if params.critic.enabled and params.critic.endpoint != "local":
        from pipeline.critic.client import api_key_for

        try:
            api_key_for(params.critic.endpoint)
        except DrlcError as err:
            warnings.append(f"critic: {err}")
    if params.critic.enabled and params.critic.model not in params.critic.prices:
        warnings.append(f"critic.prices has no entry for {params.critic.model!r}: its cost counts as $0.")
    if params.score.scorer == "perspective" and not os.environ.get("PERSPECTIVE_API_KEY"):
        warnings.append("score: PERSPECTIVE_API_KEY is not set (the perspective scorer needs it).")
    return warnings


def resolved_parameters(params: Params) -> dict:
    """Every section as a plain mapping; the rounds block summarised as count and first/last key."""
    resolved = {name: dataclasses.asdict(getattr(params, name)) for name in
                ("run", "world", "base", "rollout", "score", "critic", "ppo", "evaluate")}
    keys = params.round_keys()
    resolved["rounds"] = f"{len(keys)} rounds, {keys[0]}..{keys[-1]}, chained from base"
    return resolved


def _stage_summary(stages: list[str]) -> list[str]:
    """One line per stage family: 'rollout  x128  (rollout@0001 .. rollout@0128)'."""
    families: dict[str, list[str]] = {}
    for name in stages:
        families.setdefault(name.split("@")[0], []).append(name)
    return [f"  {family:<9} x{len(names):<5} ({names[0]}{' .. ' + names[-1] if len(names) > 1 else ''})"
            for family, names in families.items()]


def format_report(config: str, params: Params, *, critic: CriticEstimate, stages: list[str],
                  inputs: list[tuple[str, str, str]], scorer_calls: tuple[int, int] | None,
                  warnings: list[str], root: str | Path = ".") -> str:
    """The text `drlc estimate` prints."""
    lines = [f"{config}: valid ({len(params.rounds)} rounds, task {params.run.task}, "
             f"critic {'on' if params.critic.enabled else 'off'})", "", "== resolved parameters =="]
    lines += yaml.safe_dump(resolved_parameters(params), sort_keys=False, width=110, default_flow_style=None).rstrip().splitlines()
    lines += ["", f"== stages `dvc repro` would run: {len(stages)} ==", *_stage_summary(stages)]
    if not stages:
        lines.append("  (no dvc.yaml found; pass --dvc-file)")
    lines += ["", "== models and data sets =="]
    for role, name, kind in inputs:
        status = "built by the pipeline" if kind == "built" else source_status(name, kind=kind, root=root)
        lines.append(f"  {role:<28} {name}  [{status}]")
    c = critic
    lines += ["", "== critic ==",
              f"  model {params.critic.model} at {params.critic.endpoint}"
              + (f" (backend {params.critic.backend})" if params.critic.endpoint == "local" else ""),
              f"  critique rate: {c.critique_rate:g} ({c.rate_source})",
              f"  calls per round: {c.calls_per_round:g} of {c.batch_size} responses; "
              f"run total: {c.calls:g} (upper bound {c.calls_upper_bound} = {c.batch_size} x {c.rounds} rounds)",
              f"  tokens per call: ~{c.prompt_tokens} prompt + ~{c.completion_tokens} completion "
              f"(at most {c.completion_tokens_max}); counted with {c.token_counter}"]
    if c.priced:
        lines.append(f"  cost: ${c.usd:.2f} expected, ${c.usd_upper_bound:.2f} upper bound "
                     f"(every response critiqued, every answer {c.completion_tokens_max} tokens) at "
                     f"{params.critic.prices[params.critic.model]} USD per 1M prompt/completion tokens")
    else:
        lines.append("  cost: unpriced model (critic.prices has no entry): $0 counted")
    lines.append("  re-runs and replays answer from cache/critic: $0")
    if scorer_calls:
        train, evaluation = scorer_calls
        hours = (train + evaluation) / params.score.rate_limit_per_s / 3600
        lines += ["", "== remote scorer (perspective) ==",
                  f"  calls: {train} in training + {evaluation} in evaluation (before cache hits); "
                  f"~{hours:.1f} h at {params.score.rate_limit_per_s:g} requests/s"]
    if warnings:
        lines += ["", "== warnings ==", *[f"  {w}" for w in warnings]]
    return "\n".join(lines)


def cmd_estimate(args) -> None:
    """Validate CONFIG offline and print the dry run, the critic calls and their cost."""
    params = load_params(args.config, args.set)
    warnings = check_offline(params, root=args.root, processes=args.processes)
    measured = measured_critique_rate(params, args.data) if args.data else None
    if args.data and measured is None:
        warnings.append(f"--data {args.data}: no scores tables found; the critique rate is not measured.")
    critic = estimate_critic(params, root=args.root, stated_rate=args.critique_rate, measured_rate=measured,
                             document_tokens=args.document_tokens)
    print(format_report(args.config, params, critic=critic, stages=planned_stages(params, args.dvc_file),
                        inputs=inputs_of(params), scorer_calls=remote_scorer_calls(params, args.root),
                        warnings=warnings, root=args.root))


def add_estimate_parser(subparsers) -> None:
    """Add `drlc estimate CONFIG` to the `drlc` command's subparsers."""
    p = subparsers.add_parser("estimate", help="validate a params file offline; print the dry run, "
                                               "critic calls and API cost")
    p.add_argument("config", help="params file, e.g. configs/paper/sentiment-dense.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a key")
    p.add_argument("--critique-rate", type=float, default=None,
                   help="share of responses critiqued, for a selective critic.threshold")
    p.add_argument("--data", default=None, help="a finished run's data folder: measure the critique rate")
    p.add_argument("--document-tokens", type=int, default=DEFAULT_DOCUMENT_TOKENS,
                   help=f"summarization: tokens per document in the critic prompt (default {DEFAULT_DOCUMENT_TOKENS})")
    p.add_argument("--processes", type=int, default=1, help="data-parallel processes the ppo stage will use")
    p.add_argument("--dvc-file", default="dvc.yaml")
    p.add_argument("--root", default=".", help="project root that relative paths in CONFIG refer to")
    p.set_defaults(func=cmd_estimate)
