"""`drlc estimate CONFIG`: check a params file offline and say what a run would do and cost.

Nothing is downloaded, trained or sent. The report has five parts:

- the resolved parameters (every key, defaults filled in; the rounds block summarised);
- the stages `dvc repro` would run (dvc.yaml's stages, `foreach` expanded over the rounds or chunks);
- the models and data sets the run would load, each marked local, a hub id (with whether the
  Hugging Face cache already holds it) or a missing local path;
- the critic: calls per round and in total, tokens per call and the cost at `critic.prices`;
- disk and load time (docs/disk.md): checkpoint bytes, their number, the workspace and DVC cache
  totals, the model loads of every stage process and their share of the estimated run time.

Critic calls. A response is critiqued when its environment reward is <= critic.threshold, so
the upper bound is rollout.batch_size x rounds. When the threshold is at or above the largest
reward the scorer can give (`reward_maximum`), every response is critiqued and the bound is the
expectation. Otherwise the share is unknown before the run: pass `--critique-rate R`, or
`--data DIR` to measure it from a finished run's scores tables; without either the report gives
the upper bound and says so. With a switch-over after round R (params `switch`) only rounds 1..R
are priced: the tagger trained on their answers critiques the rest at $0 (same calls, drlc's own
server); the report gives the cost without the switch beside it.

Tokens. Prompt tokens = the template's system and user text with the placeholders filled by
nothing, plus the response (the mean of rollout.min_new_tokens and max_new_tokens), plus the
document for summarization (`--document-tokens`), plus CHAT_OVERHEAD_TOKENS. Completion tokens
= one "Label: " line per template label plus half the response in quoted spans, capped at
critic.max_tokens; the cost upper bound prices every answer at critic.max_tokens. Text is
counted with the base model's tokenizer when base.model is a local folder, else as chars / 4.

Disk. Parameter counts come from the model's config.json when it is a local folder, else from
pipeline/model/shapes.py's KNOWN_MODELS (the hub shapes of the models the paper configs name), built
on the meta device (no memory, no weights). A checkpoint models/round=N (pipeline/model/policy.py write_policy_files,
pipeline/train/trainer.py save_trainer_state) = the LM in its saved dtype (LoRA: the adapters only, fp32,
the base referenced by adapter_config.json) + value head (hidden + 1, fp32) + Adam's two moments of
every trainable parameter (all, or those above ppo.num_shared_layers, or adapters + value head) +
the tokenizer (its local files, else a rough size). There is one checkpoint per chunk of
run.rounds_per_stage rounds: ceil(rounds / K). DVC's cache adds a second copy unless `cache.type`
in .dvc/config starts with hardlink or symlink (reflink falls back to copy on ext4).

Load time. Each stage process reads the models it uses: rollout the policy; score a local scorer
model (score.model of hf_classifier / reward_model); critique the base tokenizer and a local hf
critic; ppo the policy with its optimizer state and the reference (models/base; none for LoRA,
whose base the policy already loads). With K = 1 that is 4 processes a round; with K > 1 one
process a chunk reads every folder once. Reads and checkpoint writes go at --disk-gbps (1 GB/s).
The run time they are a share of assumes FAST compute, so the share is not understated:
per round, 2 x params FLOPs per query and response token generated, 2 x 2 x params for the ppo
stage's no-grad policy and reference passes, ppo_epochs x (2 x params forward + 2 x trainable
weight gradients + activation gradients: 2 x params for LoRA, else 2 x trainable), 2 x params of a
local scorer model, all at --gpu-tflops (400 TFLOP/s); query tokens = the summarization document
(DEFAULT_DOCUMENT_TOKENS) or the mean prefix length; plus critic calls x --critic-latency-s (0.5 s)
/ critic.max_concurrency, plus a remote scorer's batch_size / score.rate_limit_per_s. The base
and evaluate stages (once per run) are not counted.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline.core.config import Params, load_params
from pipeline.core.errors import ConfigError, DrlcError
from pipeline.model.folders import looks_like_path
from pipeline.model.gguf import header_config, is_gguf_spec, resolve_gguf
from pipeline.model.shapes import DTYPE_BYTES, known_config, lora_parameter_count, meta_model

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
    paid_rounds: int | None = None  # switch-over: rounds 1..R at the critic's prices, the rest by the run's tagger ($0)

    @property
    def calls(self) -> float:
        return self.calls_per_round * self.rounds

    @property
    def priced_share(self) -> float:
        """Share of the rounds whose calls are priced: R / rounds with a switch-over, else 1."""
        return 1.0 if self.paid_rounds is None else self.paid_rounds / self.rounds

    @property
    def usd(self) -> float:
        return self.usd_without_switch * self.priced_share

    @property
    def usd_upper_bound(self) -> float:
        return self.calls_upper_bound * self.usd_per_call_max * self.priced_share

    @property
    def usd_without_switch(self) -> float:
        """The expected cost had the critic critiqued every round."""
        return self.calls * self.usd_per_call


def reward_maximum(params: Params) -> float | None:
    """The largest environment reward the configured scorer can give, or None when unbounded.

    The task module's reward_range says it (pipeline/tasks/<task>.py, from the reward's RANGE).
    """
    from pipeline.tasks import get_task

    return get_task(params.run.task).reward_range(params.score)[1]


def measured_critique_rate(params: Params, data_dir: str | Path) -> float | None:
    """Share of scored responses with env_reward <= critic.threshold in DIR/scores, or None if none."""
    from pipeline.core import store

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
    from pipeline.tasks import get_task

    rate, source = critique_rate(params, stated=stated_rate, measured=measured_rate)
    count, counter_name = token_counter(params, root)
    template = load_template(Path(root) / params.critic.template, task=params.run.task,
                             labels=params.critic.labels, fields=get_task(params.run.task).critic_fields)
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
        token_counter=counter_name, paid_rounds=int(params.switch_round()) if params.switch else None)


def planned_stages(params: Params, dvc_file: str | Path = "dvc.yaml") -> list[str]:
    """dvc.yaml's stage names with `foreach` stages expanded (name@key): over the rounds, or over the
    chunks for `foreach: ${chunks}` (per-round stages have no rounds then: `rounds: {}`), or over
    the `distill` keys for `foreach: ${distill}`, or the switch-over's R for `foreach: ${switch}`."""
    path = Path(dvc_file)
    if not path.is_file():
        return []
    stages = (yaml.safe_load(path.read_text()) or {}).get("stages", {})
    keys = {"${rounds}": [] if params.chunks or params.switch else params.round_keys(),
            "${chunks}": sorted(params.chunks), "${distill}": sorted(params.distill),
            "${switch}": sorted(params.switch)}
    names = []
    for name, spec in stages.items():
        expanded = keys.get(spec["foreach"], params.round_keys()) if "foreach" in spec else None
        names += [name] if expanded is None else [f"{name}@{key}" for key in expanded]
    return names


def _hub_cached(repo_id: str, kind: str) -> bool:
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
    return (hub.expanduser() / f"{kind}s--{repo_id.replace('/', '--')}").is_dir()


def source_status(name: str, *, kind: str, root: str | Path = ".") -> str:
    """'local', 'local (<file>.gguf)', 'hub (cached)', 'hub: NOT LOCAL, needs a download' or 'MISSING local path'."""
    if is_gguf_spec(name):
        try:
            return f"local ({resolve_gguf(name, key='base.model').name})"
        except ConfigError:
            return "MISSING local path"
    if name.startswith("hub:"):
        name, kind = name[len("hub:"):].partition(":")[0], "dataset"  # hub:<id>[:<split>]
    elif ":" in name and (Path(root) / name.rpartition(":")[0]).exists():
        return "local"  # a saved DatasetDict folder with a split: DIR:<split>
    if (Path(root) / name).exists():
        return "local"
    if looks_like_path(name):
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
    from pipeline.commands.replay import without_remote
    from pipeline.steps.preflight import check_inputs

    check_inputs(without_remote(params), root)  # template task and labels, cache dir; the API key is a warning below
    ppo = params.ppo  # rollout.batch_size vs the minibatch is checked at load (pipeline/core/config.py)
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
    free = params.critic.endpoint == "local" and params.critic.backend in ("lexicon", "rules", "echo")  # no model
    if params.critic.enabled and not free and params.critic.model not in params.critic.prices:
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
                  warnings: list[str], root: str | Path = ".", disk: DiskEstimate | None = None,
                  load: TimeEstimate | None = None) -> str:
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
    if c.paid_rounds is not None:
        lines.append(f"  switch-over: rounds 0001..{c.paid_rounds:04d} at the critic's prices (the cost above), rounds "
                     f"{c.paid_rounds + 1:04d}..{c.rounds:04d} by the run's own tagger: $0; without the switch "
                     f"${c.usd_without_switch:.2f} expected, "
                     f"${c.calls_upper_bound * c.usd_per_call_max:.2f} upper bound")
    lines.append("  re-runs and replays answer from cache/critic: $0")
    if scorer_calls:
        train, evaluation = scorer_calls
        hours = (train + evaluation) / params.score.rate_limit_per_s / 3600
        lines += ["", "== remote scorer (perspective) ==",
                  f"  calls: {train} in training + {evaluation} in evaluation (before cache hits); "
                  f"~{hours:.1f} h at {params.score.rate_limit_per_s:g} requests/s"]
    if disk is not None and load is not None:
        lines += disk_section(disk, load)
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
    disk = estimate_disk(params, root=args.root)
    load = estimate_time(params, disk, critic, root=args.root, disk_gbps=args.disk_gbps, gpu_tflops=args.gpu_tflops,
                         critic_latency_s=args.critic_latency_s)
    print(format_report(args.config, params, critic=critic, stages=planned_stages(params, args.dvc_file),
                        inputs=inputs_of(params), scorer_calls=remote_scorer_calls(params, args.root),
                        warnings=warnings, root=args.root, disk=disk, load=load))
    from pipeline.commands.runtime import runtime_section

    print("\n".join(runtime_section(report_run_time(params, disk, critic, load, args))))
    missing = [f"{role} = {name!r}" for role, name, kind in inputs_of(params)
               if kind != "built" and source_status(name, kind=kind, root=args.root) == "MISSING local path"]
    if missing:
        raise ConfigError(f"{args.config}: missing local path(s) {'; '.join(missing)}: fix the path "
                          f"(relative to {Path(args.root).resolve()}) before `dvc repro`.")


def report_run_time(params: Params, disk, critic: CriticEstimate, load: TimeEstimate, args):
    """The run time of pipeline/commands/runtime.py (stated assumptions, or measured with --calibrate)."""
    from pipeline.commands.runtime import PolicyShape, layers_hidden, run_time, timed_critic_calls

    found = _config_of(params.base.model, args.root) if params.base.model else _built_config(params)
    config = found[0] if found else None
    layers, hidden = layers_hidden(config) if config is not None else (0, 0)
    scorer = _config_of(params.score.model, args.root) if loads_scorer_model(params) and params.score.model else None
    shape = PolicyShape(params=disk.policy.params, layers=layers, hidden=hidden, dtype_bytes=disk.policy.dtype_bytes,
                        trainable=min(disk.policy.trainable, disk.policy.params),
                        scorer_params=model_size(params.score.model, args.root).params if scorer else 0,
                        scorer_layers=layers_hidden(scorer[0])[0] if scorer else 0)
    per_stage = params.run.rounds_per_stage == 1  # then each stage counts its own loads and writes
    return run_time(params, shape, config=config, query=query_tokens(params), response=mean_response_tokens(params),
                    critic_calls_per_round=timed_critic_calls(params, critic.calls_per_round),
                    critic_latency_s=args.critic_latency_s, io_s=0.0 if per_stage else load.load_s + load.write_s,
                    calibrate=args.calibrate, loads=load.loads if per_stage else None,
                    checkpoint_bytes=disk.checkpoint_bytes if per_stage else 0.0, root=args.root)


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
    p.add_argument("--disk-gbps", type=float, default=DEFAULT_DISK_GBPS,
                   help=f"disk throughput for model loads and checkpoint writes, GB/s (default {DEFAULT_DISK_GBPS:g})")
    p.add_argument("--gpu-tflops", type=float, default=DEFAULT_GPU_TFLOPS,
                   help=f"sustained GPU throughput of the compute model, TFLOP/s (default {DEFAULT_GPU_TFLOPS:g})")
    p.add_argument("--critic-latency-s", type=float, default=DEFAULT_CRITIC_LATENCY_S,
                   help=f"seconds per critic call (default {DEFAULT_CRITIC_LATENCY_S:g})")
    p.add_argument("--calibrate", action="store_true",
                   help="time a few training and decoding steps at the policy's shape on run.device and use "
                        "the measured speed instead of the stated assumptions (seconds)")
    p.add_argument("--dvc-file", default="dvc.yaml")
    p.add_argument("--root", default=".", help="project root that relative paths in CONFIG refer to")
    p.set_defaults(func=cmd_estimate)


# ---- disk and model-load time (`== disk and load time ==`; docs/disk.md) -------------------------

GB = 1e9
DEFAULT_DISK_GBPS = 1.0  # sequential read/write of one NVMe/network volume; --disk-gbps
# Assumed FAST compute, so the share of model loading is not understated: above what one H100 sustains
# on batch-16 PPO steps (its dense bf16/TF32 peak is ~990/495 TFLOP/s; small batches reach a fraction).
DEFAULT_GPU_TFLOPS = 400.0  # --gpu-tflops
DEFAULT_CRITIC_LATENCY_S = 0.5  # seconds per critic call, remote or local; --critic-latency-s
LINKED_CACHE_TYPES = ("hardlink", "symlink")  # cache.type values that keep no second copy
ADAM_MOMENTS = 2  # exp_avg and exp_avg_sq, one of each per trainable parameter, in its dtype
TOKENIZER_BYTES = {"gpt2": 3_600_000, "llama": 2_400_000}  # save_pretrained's tokenizer files, roughly
DEFAULT_TOKENIZER_BYTES = 4_000_000


@dataclass(frozen=True)
class ModelSize:
    """One model's parameter count and saved bytes, and where the numbers come from."""

    name: str
    params: int
    dtype_bytes: int
    source: str
    trainable: int = 0  # parameters the policy's optimizer holds (policy only)
    adapter_params: int = 0  # LoRA adapters (policy only)
    hidden_size: int = 0
    tokenizer_bytes: int = 0

    @property
    def bytes(self) -> int:
        return self.params * self.dtype_bytes


def _config_of(name: str, root: str | Path):
    """(transformers config, kind, dtype name, source) of model `name`, or None when unknown offline."""
    from transformers import AutoConfig

    folder = Path(root) / name
    if (folder / "config.json").is_file():
        config = AutoConfig.from_pretrained(folder)
        dtype = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "float32")
        architectures = getattr(config, "architectures", None) or []
        kind = "classifier" if any(a.endswith("ForSequenceClassification") for a in architectures) else (
            "causal" if any(a.endswith("LMHeadModel") or a.endswith("CausalLM") for a in architectures) or not
            architectures else "trunk")
        return config, kind, dtype.removeprefix("torch."), f"{name}/config.json"
    if is_gguf_spec(name):
        return _gguf_config(name)
    known = known_config(name)
    if known is None:
        return None
    return *known, "drlc's table of hub shapes"


def _gguf_config(spec: str):
    """The config in a GGUF file's header (None when the spec does not resolve: `drlc check` names why).

    transformers dequantises a GGUF model to float32 on load, so the policy, its saves and its
    optimizer hold float32 weights whatever the file's quantisation.
    """
    try:
        path = resolve_gguf(spec, key="base.model")
    except ConfigError:
        return None
    return header_config(path), "causal", "float32", f"{path.name}'s GGUF header"


def _built_config(params: Params):
    """The tiny GPT-2 the base stage pretrains when base.model is null (vocab = base.vocab_size, roughly)."""
    from transformers import GPT2Config

    b = params.base
    config = GPT2Config(vocab_size=b.vocab_size, n_positions=b.block_size, n_embd=b.n_embd, n_layer=b.n_layer,
                        n_head=b.n_head, bos_token_id=0, eos_token_id=0)
    return config, "causal", "float32", "base.* (the GPT-2 the base stage builds)"


def model_size(name: str | None, root: str | Path = ".", params: Params | None = None) -> ModelSize:
    """Parameters and saved bytes of model `name`; with `params`, also the policy's trainable part.

    The policy trains every weight, or those above ppo.num_shared_layers, or (base.lora_r > 0) the
    LoRA adapters only; the value head (hidden + 1) always with ppo.algorithm ppo, never with a value-free one.
    A model unknown offline counts 0.
    """
    from pipeline.model.reference import shared_parameter_names

    found = _config_of(name, root) if name else (_built_config(params) if params else None)
    if found is None:
        return ModelSize(name or "?", 0, 4, "UNKNOWN offline (not local, not in drlc's table): counted as 0 bytes")
    config, kind, dtype, source = found
    model = meta_model(config, kind)
    total = sum(p.numel() for p in model.parameters())
    model_type = getattr(config, "model_type", "")
    if name is None:  # the base stage's own word-piece tokenizer: its vocabulary in tokenizer.json, roughly
        tokenizer = 64 * config.vocab_size
    else:
        tokenizer = _local_tokenizer_bytes(Path(root) / name) or TOKENIZER_BYTES.get(model_type,
                                                                                     DEFAULT_TOKENIZER_BYTES)
    size = ModelSize(name or "(built from base.*)", total, DTYPE_BYTES.get(dtype, 4), source, tokenizer_bytes=tokenizer,
                     hidden_size=getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0))
    if params is None:
        return size
    head = size.hidden_size + 1 if params.ppo.algorithm == "ppo" else 0  # value-free algorithms have no value head
    if params.base.lora_r > 0:
        adapters = lora_parameter_count(model, params.base.lora_r, params.base.lora_target_modules)
        return dataclasses.replace(size, adapter_params=adapters, trainable=adapters + head)
    frozen = 0
    if params.ppo.num_shared_layers is not None:
        named = dict(model.named_parameters())
        frozen = sum(named[n].numel() for n in shared_parameter_names(model, params.ppo.num_shared_layers))
    return dataclasses.replace(size, trainable=total - frozen + head)


def _local_tokenizer_bytes(folder: Path) -> int:
    names = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt", "tokenizer_config.json",
             "special_tokens_map.json")
    return sum((folder / n).stat().st_size for n in names if (folder / n).is_file())


def cache_link_type(root: str | Path = ".") -> str:
    """`cache.type` of ROOT/.dvc/config (DVC's default `reflink,copy` when unset)."""
    import configparser

    config = configparser.ConfigParser()
    config.read(Path(root) / ".dvc" / "config")
    return config.get("cache", "type", fallback="reflink,copy").replace(" ", "")


def cache_copies(cache_type: str) -> int:
    """Copies DVC's cache adds to the workspace's: 0 for hardlink/symlink, 1 for reflink/copy.

    Reflinks share blocks only on btrfs/XFS/APFS; on ext4 DVC falls back to copy, so they count 1.
    """
    return 0 if cache_type.split(",")[0] in LINKED_CACHE_TYPES else 1


@dataclass(frozen=True)
class DiskEstimate:
    """Bytes a run leaves in models/ (workspace) and DVC's cache; see docs/disk.md."""

    rounds: int
    rounds_per_stage: int
    weights_bytes: int  # per checkpoint: the LM in its saved dtype (LoRA: the adapters only)
    value_head_bytes: int
    optimizer_bytes: int  # Adam's moments of the trainable parameters
    tokenizer_bytes: int
    base_bytes: int  # models/base, once
    cache_type: str
    policy: ModelSize

    @property
    def checkpoints(self) -> int:
        return math.ceil(self.rounds / self.rounds_per_stage)

    @property
    def checkpoint_bytes(self) -> int:
        return self.weights_bytes + self.value_head_bytes + self.optimizer_bytes + self.tokenizer_bytes

    @property
    def workspace_bytes(self) -> int:
        return self.checkpoints * self.checkpoint_bytes + self.base_bytes

    @property
    def cache_bytes(self) -> int:
        """What DVC's cache holds beyond the workspace: a second copy unless cache.type links."""
        return cache_copies(self.cache_type) * self.workspace_bytes

    @property
    def total_bytes(self) -> int:
        return self.workspace_bytes + self.cache_bytes

    @property
    def beyond_base_bytes(self) -> int:
        return self.total_bytes - self.base_bytes


def estimate_disk(params: Params, *, root: str | Path = ".", cache_type: str | None = None,
                  policy: ModelSize | None = None) -> DiskEstimate:
    """Checkpoint bytes and their count for the run's rounds_per_stage, under `cache_type` (.dvc/config's)."""
    policy = policy or model_size(params.base.model, root, params)
    lora = params.base.lora_r > 0
    weights = policy.adapter_params * 4 if lora else policy.bytes  # peft keeps adapters fp32 on a 16-bit base
    moment_bytes = 4 if lora else policy.dtype_bytes
    return DiskEstimate(
        rounds=len(params.rounds), rounds_per_stage=params.run.rounds_per_stage, weights_bytes=weights,
        value_head_bytes=4 * (policy.hidden_size + 1) if params.ppo.algorithm == "ppo" else 0, optimizer_bytes=ADAM_MOMENTS * moment_bytes * policy.trainable,
        tokenizer_bytes=policy.tokenizer_bytes, base_bytes=policy.bytes,
        cache_type=cache_type or cache_link_type(root), policy=policy)


def loads_scorer_model(params: Params) -> bool:
    """True when the score stage loads score.model: the scorer is one of its task's MODEL_SCORERS."""
    from pipeline.tasks import get_task

    return params.score.scorer in get_task(params.run.task).MODEL_SCORERS


def query_tokens(params: Params) -> float:
    """Mean query length: a summarization document (DEFAULT_DOCUMENT_TOKENS), else the prefix length."""
    if params.run.task == "summarization":
        return DEFAULT_DOCUMENT_TOKENS
    return (params.world.prefix_min_words + params.world.prefix_max_words) / 2


def process_loads(params: Params, disk: DiskEstimate, *, first: bool, score: ModelSize,
                  critic: ModelSize | None) -> dict[str, dict[str, int]]:
    """{stage process: {model folder it loads: bytes read}} for one round; `first` = it starts from models/base.

    rollout loads the policy; score its scorer model; critique the base tokenizer and a local hf
    critic; ppo the policy with its optimizer state and the reference (a LoRA policy's reference is
    the policy with adapters disabled, and its base is models/base).
    """
    lora = params.base.lora_r > 0
    prev = {} if first else {"models/<prev round>": disk.weights_bytes + disk.value_head_bytes}
    policy = {"models/base": disk.base_bytes, **prev} if lora or first else prev
    loads = {"rollout": dict(policy), "score": {}, "critique": {"models/base (tokenizer)": disk.tokenizer_bytes}}
    if loads_scorer_model(params) and params.score.model:
        loads["score"][params.score.model] = score.bytes
    if critic is not None:
        loads["critique"][critic.name] = critic.bytes
    ppo = {**policy, "models/base": disk.base_bytes}  # + the reference (already there for LoRA and round 1)
    if not first:
        ppo["models/<prev round>"] += disk.optimizer_bytes
    loads["ppo"] = ppo
    return loads


def _bytes_read(loads: dict[str, dict[str, int]]) -> int:
    return sum(size for folders in loads.values() for size in folders.values())


def chunk_loads(per_round: dict[str, dict[str, int]]) -> dict[str, int]:
    """One chunk process loads every folder its rounds' stages load, once (the largest read of each)."""
    merged: dict[str, int] = {}
    for folders in per_round.values():
        for folder, size in folders.items():
            merged[folder] = max(merged.get(folder, 0), size)
    if "models/base" in merged:
        merged.pop("models/base (tokenizer)", None)  # the tokenizer comes with the base model
    return merged


def round_flops(params: Params, policy: ModelSize, score: ModelSize) -> float:
    """FLOPs of one round (see the module docstring's compute model)."""
    tokens = params.rollout.batch_size * (query_tokens(params) + mean_response_tokens(params))
    p, trainable = policy.params, policy.trainable
    generate = 2 * p * tokens  # prefill and decoding: 2 FLOPs per parameter per token
    no_grad = 2 * 2 * p * tokens  # the ppo stage's policy and reference passes
    backward = 2 * trainable + 2 * (p if params.base.lora_r > 0 else trainable)  # weight + activation grads
    train = params.ppo.ppo_epochs * tokens * (2 * p + backward)
    scorer = 2 * score.params * tokens if loads_scorer_model(params) else 0
    return generate + no_grad + train + scorer


@dataclass(frozen=True)
class TimeEstimate:
    """Model loading (and checkpoint writing) against an estimated run time; see the module docstring."""

    rounds: int
    rounds_per_stage: int
    processes: int  # stage processes of the rounds that load models
    loads: dict  # {process: {folder: bytes}} of a round (K = 1) or {"chunk": {folder: bytes}} of a chunk
    read_bytes: int  # models read over all rounds
    write_bytes: int  # checkpoints written over all rounds
    compute_s: float  # per round, at gpu_tflops
    critic_s: float  # per round, at critic_latency_s and critic.max_concurrency
    scorer_s: float  # per round: a remote scorer's rate limit
    disk_gbps: float
    gpu_tflops: float
    critic_latency_s: float

    @property
    def load_s(self) -> float:
        return self.read_bytes / (self.disk_gbps * GB)

    @property
    def write_s(self) -> float:
        return self.write_bytes / (self.disk_gbps * GB)

    @property
    def run_s(self) -> float:
        return self.rounds * (self.compute_s + self.critic_s + self.scorer_s) + self.load_s + self.write_s

    @property
    def load_share(self) -> float:
        """Model loading's share of the run time (the target of docs/disk.md: <= 5 %)."""
        return self.load_s / self.run_s

    @property
    def io_share(self) -> float:
        """Loading and checkpoint writing together."""
        return (self.load_s + self.write_s) / self.run_s


def estimate_time(params: Params, disk: DiskEstimate, critic: CriticEstimate, *, root: str | Path = ".",
                  disk_gbps: float = DEFAULT_DISK_GBPS, gpu_tflops: float = DEFAULT_GPU_TFLOPS,
                  critic_latency_s: float = DEFAULT_CRITIC_LATENCY_S) -> TimeEstimate:
    """Model loads of the training rounds and the run time they are a share of (training rounds only)."""
    if min(disk_gbps, gpu_tflops, critic_latency_s) <= 0:
        raise ConfigError(f"--disk-gbps {disk_gbps}, --gpu-tflops {gpu_tflops} and --critic-latency-s "
                          f"{critic_latency_s} must all be > 0.")
    score = model_size(params.score.model, root) if loads_scorer_model(params) else model_size(None)
    critic_model = None
    if params.critic.enabled and params.critic.endpoint == "local" and params.critic.backend == "hf":
        folder = "models/base" if params.critic.model_dir in (None, "base") else params.critic.model_dir
        critic_model = dataclasses.replace(model_size(params.base.model if folder == "models/base" else folder, root),
                                           name=folder)
    k, rounds = params.run.rounds_per_stage, disk.rounds
    first = process_loads(params, disk, first=True, score=score, critic=critic_model)
    later = process_loads(params, disk, first=False, score=score, critic=critic_model)
    if k == 1:
        read = _bytes_read(first) + (rounds - 1) * _bytes_read(later)
        loads, processes = later, len(later) * rounds
    else:
        read = sum(chunk_loads(first).values()) + (disk.checkpoints - 1) * sum(chunk_loads(later).values())
        loads, processes = {"chunk": chunk_loads(later)}, disk.checkpoints
    # a local critic other than the hf backend (lexicon, offline) answers in no time worth counting
    timed = params.critic.enabled and (params.critic.endpoint != "local" or params.critic.backend == "hf")
    calls = critic.calls_per_round if timed else 0.0
    remote_scorer = params.score.scorer == "perspective"
    return TimeEstimate(
        rounds=rounds, rounds_per_stage=k, processes=processes, loads=loads, read_bytes=read,
        write_bytes=disk.checkpoints * disk.checkpoint_bytes,
        compute_s=round_flops(params, disk.policy, score) / (gpu_tflops * 1e12),
        critic_s=calls * critic_latency_s / params.critic.max_concurrency,
        scorer_s=params.rollout.batch_size / params.score.rate_limit_per_s if remote_scorer else 0.0,
        disk_gbps=disk_gbps, gpu_tflops=gpu_tflops, critic_latency_s=critic_latency_s)


def _gb(n: float) -> str:
    if n < GB:
        return f"{n / 1e6:.1f} MB"
    return f"{n / GB:.1f} GB" if n < 100 * GB else f"{n / GB:,.0f} GB"


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def disk_section(disk: DiskEstimate, load: TimeEstimate) -> list[str]:
    """The `== disk and load time ==` lines of the report."""
    d, t, policy = disk, load, disk.policy
    lora = d.policy.adapter_params > 0
    copies = cache_copies(d.cache_type)
    lines = ["", "== disk and load time (docs/disk.md) ==",
             f"  policy {policy.name}: {policy.params:,} parameters, {policy.dtype_bytes} bytes each ({policy.source}); "
             f"trainable {policy.trainable:,}" + (f" (LoRA adapters {policy.adapter_params:,} + value head)" if lora else ""),
             f"  checkpoint models/round=N: {_gb(d.checkpoint_bytes)} = "
             f"{'adapters' if lora else 'weights'} {_gb(d.weights_bytes)} + value head {_gb(d.value_head_bytes)} + "
             f"optimizer (Adam, 2 moments) {_gb(d.optimizer_bytes)} + tokenizer ~{_gb(d.tokenizer_bytes)}"
             + ("; the base is referenced, not copied" if lora else ""),
             f"  checkpoints: {d.checkpoints} = ceil({d.rounds} rounds / run.rounds_per_stage {d.rounds_per_stage})",
             f"  workspace: {_gb(d.workspace_bytes)} (checkpoints + models/base {_gb(d.base_bytes)}); DVC cache "
             f"(cache.type {d.cache_type}): {_gb(d.cache_bytes)} "
             + ("more (no second copy: links)" if not copies else "more (a second copy: reflink falls back to copy on ext4)"),
             f"  total: {_gb(d.total_bytes)}; beyond models/base: {_gb(d.beyond_base_bytes)}",
             f"  model loads: {t.processes} stage processes; "
             + ("per round (from round 2): " if t.rounds_per_stage == 1 else "per chunk (from chunk 2): ")
             + "; ".join(f"{proc} " + (", ".join(f"{f} {_gb(b)}" for f, b in folders.items()) or "none")
                         for proc, folders in t.loads.items()),
             f"  read {_gb(t.read_bytes)} -> {t.load_s:,.0f} s, write {_gb(t.write_bytes)} -> {t.write_s:,.0f} s "
             f"at {t.disk_gbps:g} GB/s (--disk-gbps)",
             f"  fast-compute lower bound ~{_duration(t.run_s)} (the load share's denominator; the realistic "
             f"figure is under == run time ==): per round compute {t.compute_s:.3f} s at {t.gpu_tflops:g} TFLOP/s "
             f"(--gpu-tflops) + critic {t.critic_s:.2f} s ({t.critic_latency_s:g} s a call, --critic-latency-s) + "
             f"remote scorer {t.scorer_s:.1f} s, plus the loads and writes",
             f"  model loading: {100 * t.load_share:.1f} % of the run time (with checkpoint writes "
             f"{100 * t.io_share:.1f} %); fast compute assumed, so these shares are upper-end"]
    return lines
