"""Typed, frozen parameters: one dataclass per params.yaml section, one loader.

`load_params("params.yaml")` reads the YAML, applies `key=value` overrides, and checks every
value before any compute starts, and every combination of values that a later stage needs
(`_check_combinations`), so a mistake fails at `drlc check`, not after hours of rollouts.
The dataclass defaults are the demo profile of params.yaml (tests/test_config.py compares them). An unknown key, a wrong type or an out-of-range value raises
ConfigError naming the dotted key, the bad value and what would be valid (with the nearest
valid key for typos). Derived values are properties; nothing is written back.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pipeline.core.errors import ConfigError

# The task names: one module per task in pipeline/tasks/, listed from the folder without importing
# it (the checks each task declares run in pipeline.tasks.check_params, not here).
TASKS = tuple(sorted(p.stem for p in (Path(__file__).parents[1] / "tasks").glob("*.py") if not p.name.startswith("_")))


def is_task_file(task: str) -> bool:
    """A `run.task` naming the user's task file (``tasks/x.py``) or module (``tasks.x``), not a built-in task."""
    return task not in TASKS and (task.endswith(".py") or "." in task or "/" in task)


ALIGNMENTS = ("exact", "substring")  # critic.alignment: the modes of pipeline/critic/align.py
PLACEMENTS = ("tokens", "summed", "random")  # critic.placement: on the spans' tokens, summed on the last, at random words
ROLLOUT_ENGINES = ("hf", "vllm")  # rollout.engine: drlc's sampler, vLLM (pipeline/model/vllm_engine.py)
ALGORITHMS = ("ppo", "grpo", "rloo", "reinforce_pp")  # ppo.algorithm; all but "ppo" are value-free
LOSS_TYPES = ("grpo", "dr_grpo", "dapo")  # ppo.loss_type (TRL GRPOConfig.loss_type)
KL_PENALTIES = ("kl", "abs", "mse", "full")
ROUND_KEY = re.compile(r"^\d{4}$")
DISTILL_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


class _YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, plus YAML 1.2 floats without a dot such as `1e-4` (1.1 reads a string),
    and a duplicate key in one mapping is an error (PyYAML keeps the last silently; DVC refuses the file)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {seen[key] + 1}): keep one; a second "
                    f"section or key replaces the first", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def read_yaml(text: str):
    return yaml.load(text, Loader=_YamlLoader)


def yaml_error_line(err: yaml.YAMLError) -> str:
    """A PyYAML error as one line: 'line L, column C: <problem>' (PyYAML's own text spans several lines)."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context = getattr(err, "context", None)
    return f"{where}{problem}" + (f" ({context})" if context else "")


def _positive(x) -> bool:
    return x is None or x > 0


def _probability(x) -> bool:
    return 0.0 <= x <= 1.0


@dataclass(frozen=True)
class RunParams:
    run_id: str = "demo"
    task: str = "sentiment"  # one of TASKS, or a task file in tasks/ (pipeline/tasks/_from_file.py)
    seed: int = 0
    device: str = "auto"  # auto = CUDA when available, else cpu; or cpu, cuda, cuda:N
    rounds_per_stage: int = 1  # K > 1: K consecutive rounds per `chunk` stage, models kept in memory

    checks = {
        "task": (lambda x: x in TASKS or is_task_file(x), f"one of {TASKS} or a task file tasks/<name>.py"),
        "device": (lambda x: x in ("auto", "cpu", "cuda") or bool(re.fullmatch(r"cuda:\d+", x)),
                   "auto, cpu, cuda or cuda:N (N = a GPU index)"),
        "rounds_per_stage": (_positive, "a whole number >= 1 (1 = one DVC stage per round and step)"),
    }


@dataclass(frozen=True)
class WorldParams:
    """Where the task's text comes from, and the prompts drawn from it.

    `source: world` = the task's seeded synthetic world (demo profile); else a local data file
    or folder in the task's format (local-data and paper profiles; see pipeline/tasks/<task>.py).
    """

    source: str = "world"
    n_reviews: int = 20000  # pretraining corpus of the world: reviews, comments or document+summary pairs
    n_train_prompts: int = 512
    n_eval_prompts: int = 64
    prefix_min_words: int = 2
    prefix_max_words: int = 5
    prefix_unit: str = "words"  # words, or tokens of the base tokenizer (the paper's IMDB queries: 4-10 tokens)
    min_text_chars: int = 0  # local/hub data: drop texts shorter than this (the paper's IMDB filter: 200)
    min_prompt_toxicity: float | None = None  # toxicity data: keep prompts above this (the paper: 0.6)
    eval_source: str | None = None  # task files: eval prompts from this source (null = split world.source)

    checks = {
        "source": (lambda x: bool(x.strip()), "'world' or the path of a local data file"),
        "n_reviews": (_positive, "> 0"),
        "n_train_prompts": (_positive, "> 0"),
        "n_eval_prompts": (_positive, "> 0"),
        "prefix_min_words": (_positive, "> 0"),
        "prefix_max_words": (_positive, "> 0"),
        "prefix_unit": (lambda x: x in ("words", "tokens"), "one of ('words', 'tokens')"),
        "min_text_chars": (lambda x: x >= 0, ">= 0"),
        "min_prompt_toxicity": (_probability, "in [0, 1] or null"),
        "eval_source": (lambda x: x is None or bool(x.strip()), "null or the path of a local data file"),
    }


@dataclass(frozen=True)
class BaseParams:
    """The model every round starts from, built or loaded in the `base` stage.

    `model: null` trains a BPE tokenizer and pretrains a tiny GPT-2 on the world (demo); else a
    local Hugging Face causal-LM folder or hub id is loaded (local-data and paper profiles).
    `sft_steps` > 0 then fine-tunes it on the task corpus with TRL's SFTTrainer (the paper's
    summarization runs). `lora_r` > 0 trains LoRA adapters (peft) instead of all weights; the
    reference model is then the same model with the adapters disabled.
    """

    model: str | None = None
    pad_token: str | None = None  # "eos": pad = eos when the model's tokenizer has no pad (the paper's GPT-2 runs)
    sft_steps: int = 0
    lora_r: int = 0
    lora_alpha: float = 32.0
    lora_target_modules: list[str] = field(default_factory=list)  # empty = peft's default for the model type
    vocab_size: int = 1024
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 64
    steps: int = 1200
    batch_size: int = 16
    learning_rate: float = 3e-3

    checks = {
        "vocab_size": (lambda x: x >= 300, ">= 300 (256 byte tokens + merges + specials)"),
        "n_layer": (_positive, "> 0"),
        "n_head": (_positive, "> 0"),
        "n_embd": (_positive, "> 0"),
        "block_size": (lambda x: x >= 16, ">= 16"),
        "steps": (_positive, "> 0"),
        "batch_size": (_positive, "> 0"),
        "learning_rate": (_positive, "> 0"),
        "sft_steps": (lambda x: x >= 0, ">= 0"),
        "pad_token": (lambda x: x == "eos", "'eos' or null"),
        "lora_r": (lambda x: x >= 0, ">= 0 (0 = train all weights)"),
        "lora_alpha": (_positive, "> 0"),
    }


@dataclass(frozen=True)
class RolloutParams:
    """Sampling from the current policy. Full-distribution sampling (no top-k/top-p) keeps the
    recorded behaviour log-probs equal to the policy's own log-probs."""

    batch_size: int = 128
    max_new_tokens: int = 20
    min_new_tokens: int | None = None  # per-response length limit drawn in [min, max] (seeded); null = max
    generation_batch_size: int = 128
    samples_per_prompt: int = 1  # G responses per prompt, consecutive rows (a group: ppo.algorithm grpo, rloo)
    engine: str = "hf"  # hf = drlc's sampler; vllm = vLLM (the `vllm` extra; docs/rollout-engines.md)
    vllm_gpu_memory_utilization: float = 0.2  # vllm: its share of GPU memory (on CPU: of RAM) to reserve
    vllm_args: dict[str, bool | int | float | str | None] = field(default_factory=dict)  # vllm: more vllm.LLM args

    checks = {
        "engine": (lambda x: x in ROLLOUT_ENGINES, f"one of {ROLLOUT_ENGINES}"),
        "vllm_gpu_memory_utilization": (lambda x: 0 < x <= 1, "in (0, 1]"),
        "samples_per_prompt": (_positive, "> 0"),
        "min_new_tokens": (_positive, "> 0 or null"),
        "batch_size": (_positive, "> 0"),
        "max_new_tokens": (_positive, "> 0"),
        "generation_batch_size": (_positive, "> 0"),
    }


@dataclass(frozen=True)
class ScoreParams:
    """The environment reward (pipeline/rewards/<task>.py); valid scorers depend on run.task."""

    scorer: str = "vader"  # one of the task's scorers (pipeline/tasks/<task>.py SCORERS)
    scale: float = 1.0  # PPO reads scale x the task's reward (pipeline/rewards/shaping.py); nothing else does
    model: str | None = None  # hf_classifier: a local HF text-classification folder (or hub id)
    label: str | None = None  # hf_classifier: the label whose logit/probability is read
    train_data: str | None = None  # fitted (toxicity): RealToxicityPrompts JSONL file or folder it is fit to
    batch_size: int = 64  # texts per scorer call
    endpoint: str | None = None  # perspective: API URL (null = Google's commentanalyzer)
    rate_limit_per_s: float = 1.0  # perspective: requests per second
    cache_dir: str = "cache/scores"  # perspective: content-hashed answer cache
    normalize: bool = False  # z-normalise each round's rewards as one batch (the paper's TL;DR reward model)
    # a task file's own settings, passed to each reward that names them (docs/own-task.md); `dvc exp run -S` sweeps them
    settings: dict[str, bool | int | float | str | None] = field(default_factory=dict)

    checks = {
        "scale": (_positive, "> 0"),
        "batch_size": (_positive, "> 0"),
        "rate_limit_per_s": (_positive, "> 0"),
    }


# the local critic server's backends (pipeline/critic/offline/server.py); the one list, also `drlc critic serve`'s
CRITIC_BACKENDS = ("lexicon", "echo", "hf", "tagger", "random_spans", "rules")
# critic.answer_format: free text, a JSON schema, or JSON whose spans are copied from the response
# (character for character, or whole words; pipeline/critic/structured.py); the one list
CRITIC_ANSWER_FORMATS = ("text", "json", "copy", "copy_words")
# critic.server: the server behind critic.endpoint, which decides where a constrained answer's fields go
# (pipeline/critic/servers.py); auto asks its GET /v1/models
CRITIC_SERVERS = ("auto", "drlc", "llamacpp", "vllm", "sglang", "openai")


@dataclass(frozen=True)
class CriticParams:
    enabled: bool = True
    endpoint: str = "local"  # "local" = drlc's own server on 127.0.0.1, else an OpenAI-compatible base URL
    backend: str = "lexicon"  # backend of the local server
    # hf backend: "base" (this run's base model: self-critique) or a model folder; tagger, random_spans: the tagger
    model_dir: str | None = None
    model: str = "drlc-lexicon"
    template: str = "prompts/sentiment.md"
    labels: list[str] = field(default_factory=list)  # span labels; [] = the template's front matter (.txt: required)
    threshold: float = 0.0  # critique responses with env reward <= threshold, in the task's units (before score.scale)
    rewards: dict[str, float] = field(default_factory=lambda: {"positive": 0.5, "negative": -0.5})
    alignment: str = "exact"  # one of ALIGNMENTS
    zero_mean: bool = False  # subtract each critiqued response's mean token reward (sum 0: no reward scale added)
    placement: str = "tokens"  # one of PLACEMENTS (pipeline/critic/annotate.py): where the span rewards go
    cache_dir: str = "cache/critic"
    cache_namespace: str = ""  # part of every cache key: separates caches; "" = shared by all runs
    max_concurrency: int = 8
    timeout_s: float = 60.0
    max_retries: int = 6
    # the critique stage fails when more than this share of critiqued responses ends in
    # api_error, parse_error or truncated (after caching every good answer)
    max_error_rate: float = 0.2
    max_requests: int | None = None
    max_cost_usd: float | None = None
    temperature: float = 0.0
    max_tokens: int = 256
    answer_format: str = "text"  # one of CRITIC_ANSWER_FORMATS (pipeline/critic/structured.py)
    extra_body: dict = field(default_factory=dict)  # fields added to every request body; in the cache key
    samples: int = 1  # answers per critiqued response (sample index 0..k-1), voted per character
    vote_min: int | None = None  # answers that must mark a character for it to count; None = a majority
    server: str = "auto"  # one of CRITIC_SERVERS: where json/copy constraints are sent; auto = ask GET /v1/models
    connect_wait_s: float = 0.0  # how long to wait for an endpoint that refuses connections (still starting); 0 = fail
    # USD per 1M prompt tokens and per 1M completion tokens, by model (for cost and budgets)
    prices: dict[str, list[float]] = field(default_factory=lambda: {
        "drlc-lexicon": [0.0, 0.0], "gpt-3.5-turbo": [0.5, 1.5], "gpt-4o-mini": [0.15, 0.6]})

    checks = {
        "prices": (lambda x: all(len(v) == 2 and min(v) >= 0 for v in x.values()),
                   "a mapping of model -> [usd_per_1m_prompt_tokens, usd_per_1m_completion_tokens] >= 0"),
        "alignment": (lambda x: x in ALIGNMENTS, f"one of {ALIGNMENTS}"),
        "placement": (lambda x: x in PLACEMENTS, f"one of {PLACEMENTS}"),
        "backend": (lambda x: x in CRITIC_BACKENDS, f"one of {CRITIC_BACKENDS}"),
        "max_concurrency": (_positive, "> 0"),
        "timeout_s": (_positive, "> 0"),
        "max_retries": (lambda x: x >= 0, ">= 0"),
        "max_error_rate": (_probability, "in [0, 1]"),
        "max_requests": (lambda x: x is None or x >= 0, ">= 0 or null"),
        "max_cost_usd": (lambda x: x is None or x >= 0, ">= 0 or null"),
        "temperature": (lambda x: x >= 0, ">= 0"),
        "max_tokens": (_positive, "> 0"),
        "answer_format": (lambda x: x in CRITIC_ANSWER_FORMATS, f"one of {CRITIC_ANSWER_FORMATS}"),
        "extra_body": (lambda x: isinstance(x, dict), "a mapping of request field -> value"),
        "samples": (_positive, "> 0"),
        "vote_min": (lambda x: x is None or x >= 1, ">= 1 or null"),
        "server": (lambda x: x in CRITIC_SERVERS, f"one of {CRITIC_SERVERS}"),
        "connect_wait_s": (lambda x: x >= 0, ">= 0 (seconds; 0 = fail at once)"),
    }


@dataclass(frozen=True)
class PPOParams:
    """PPO hyperparameters. Defaults are legacy TRL's PPOConfig (<= 0.11), which the paper used,
    except learning_rate (TRL and the paper on gpt2-large: 1.41e-5; the demo's tiny model needs more)."""

    learning_rate: float = 5e-4
    ppo_epochs: int = 4
    mini_batch_size: int = 16
    gradient_accumulation_steps: int = 1
    gamma: float = 1.0
    lam: float = 0.95
    cliprange: float = 0.2
    cliprange_value: float = 0.2
    vf_coef: float = 0.1
    kl_penalty: str = "kl"  # one of KL_PENALTIES
    adap_kl_ctrl: bool = True
    init_kl_coef: float = 0.2
    target: float = 6.0  # adaptive controller's KL goal
    horizon: float = 10000.0
    ratio_threshold: float = 10.0
    early_stopping: bool = False
    target_kl: float = 1.0  # early-stop bound on the policy KL when early_stopping
    max_grad_norm: float | None = None
    whiten_rewards: bool = False
    use_score_scaling: bool = False  # divide the env rewards by their running std over all rounds (TRL's "score")
    use_score_norm: bool = False  # with use_score_scaling, subtract the running mean too (not score.normalize)
    score_clip: float | None = None
    # "bf16" = bf16 autocast for forward/backward (log-probs, values stay fp32). Not "no": DVC
    # rewrites params.yaml unquoted on `dvc exp run -S`, and YAML 1.1 reads `no` as false.
    mixed_precision: str = "fp32"
    # freeze the embeddings and the first N transformer blocks and share them with the reference,
    # as TRL's create_reference_model (the paper: 20 of gpt2-large's 36); null = a full frozen copy
    num_shared_layers: int | None = None
    # the update (docs/algorithms.md): "ppo" (GAE + value head, the paper's) or a value-free one, which
    # builds no value head: "grpo" and "rloo" (groups: rollout.samples_per_prompt > 1), "reinforce_pp"
    algorithm: str = "ppo"
    loss_type: str = "grpo"  # grpo only: TRL's "grpo", "dr_grpo" (no std, constant normaliser) or "dapo"
    dense_weight: float = 1.0  # grpo, rloo: weight of the critic's per-token term; 0 = the plain algorithm
    # rollout.engine vllm only (rollouts with engine_logprobs): truncated importance sampling of the engine's
    # log-probs against the trainer's old ones, weight min(exp(old − engine), cap); null = off (docs/ppo.md)
    engine_is_cap: float | None = 2.0
    engine_gap_max: float = 1.0  # a round whose mean |old − engine| log-prob gap (nats) is above this stops

    checks = {
        "algorithm": (lambda x: x in ALGORITHMS, f"one of {ALGORITHMS}"),
        "loss_type": (lambda x: x in LOSS_TYPES, f"one of {LOSS_TYPES}"),
        "dense_weight": (lambda x: x >= 0, ">= 0"),
        "engine_is_cap": (lambda x: x >= 1, ">= 1 or null"),
        "engine_gap_max": (_positive, "> 0"),
        "num_shared_layers": (lambda x: x >= 0, ">= 0 or null"),
        "mixed_precision": (lambda x: x in ("fp32", "bf16"), "one of ('fp32', 'bf16')"),
        "learning_rate": (_positive, "> 0"),
        "ppo_epochs": (_positive, "> 0"),
        "mini_batch_size": (_positive, "> 0"),
        "gradient_accumulation_steps": (_positive, "> 0"),
        "gamma": (_probability, "in [0, 1]"),
        "lam": (_probability, "in [0, 1]"),
        "cliprange": (_positive, "> 0"),
        "cliprange_value": (_positive, "> 0"),
        "vf_coef": (lambda x: x >= 0, ">= 0"),
        "kl_penalty": (lambda x: x in KL_PENALTIES, f"one of {KL_PENALTIES}"),
        "init_kl_coef": (lambda x: x >= 0, ">= 0"),
        "target": (_positive, "> 0"),
        "horizon": (_positive, "> 0"),
        "ratio_threshold": (_positive, "> 0"),
        "target_kl": (_positive, "> 0"),
        "max_grad_norm": (_positive, "> 0 or null"),
        "score_clip": (_positive, "> 0 or null"),
    }

    @property
    def backward_batch_size(self) -> int:
        return self.mini_batch_size * self.gradient_accumulation_steps


@dataclass(frozen=True)
class EvaluateParams:
    """Evaluation as in the DExperts protocol: N nucleus samples per prompt, scored by a sentiment
    classifier that is not the training reward, a fluency LM and dist-n."""

    policy: str = "round=0004"  # the policy evaluated against the base; must be the last round
    prompts: list[str] = field(default_factory=lambda: ["world"])  # "world" or DExperts JSONL paths
    n_prompts: int | None = 32  # first n prompts of each set (DExperts' sample_size); null = all
    samples_per_prompt: int = 25
    max_new_tokens: int = 20
    top_p: float = 0.9
    batch_size: int = 64  # sequences per generation / perplexity batch
    classifier_data: str = "world"  # "world" = labelled synthetic reviews, or a "<0|1> <text>" file
    fluency_model: str = "base"  # "base" = the run's base model, or a local HF causal-LM folder
    reward_model: str | None = None  # summarization: a reward-model folder for RM score and win rate
    instruction: str | None = None  # text put before every prompt (the paper's few-shot prompting baseline)
    every: int = 1  # held-out eval curve: every K-th round's policy (and the last), metrics/eval_rounds.json; 0 = off
    curve_samples: int = 1  # samples per prompt of the curve's points (the final eval keeps samples_per_prompt)

    checks = {
        "prompts": (lambda x: len(x) > 0, "a non-empty list of 'world' or JSONL paths"),
        "every": (lambda x: x >= 0, ">= 0 (0 = no eval curve)"),
        "curve_samples": (_positive, "> 0"),
        "n_prompts": (_positive, "> 0 or null"),
        "samples_per_prompt": (_positive, "> 0"),
        "max_new_tokens": (_positive, "> 0"),
        "top_p": (lambda x: 0 < x <= 1, "in (0, 1]"),
        "batch_size": (_positive, "> 0"),
    }


@dataclass(frozen=True)
class RoundParams:
    """One PPO round; `prev` names the policy it starts from ("base" or "round=NNNN")."""

    prev: str = "base"


@dataclass(frozen=True)
class ChunkParams:
    """One `chunk` stage (run.rounds_per_stage > 1): its key's round to `last`, starting from `prev`."""

    prev: str = "base"
    last: str = "0001"


@dataclass(frozen=True)
class DistillParams:
    """One `distill@<key>` stage: a span tagger trained on `spans` into critics/<key> (docs/tagger.md)."""

    spans: str = ""              # labelled span file, SemEval .csv or drlc .jsonl (`drlc critic distill --spans`)
    seed: int = 0                # seed of the held-out split
    heldout_share: float = 0.15  # share of texts held out to tune decoding and score the card

    checks = {
        "spans": (lambda x: bool(x), "a labelled span file path (.csv or .jsonl)"),
        "heldout_share": (lambda x: 0 < x < 1, "in (0, 1)"),
    }


@dataclass(frozen=True)
class SwitchParams:
    """The switch-over `switch.<R>`: the configured critic critiques rounds 1..R, a span tagger trained on
    their read answers (stage switch_distill@R, into models/tagger=R) critiques rounds R+1..last (docs/tagger.md)."""

    last: str = "0002"           # the run's last round (evaluate.policy names it)
    seed: int = 0                # seed of the tagger's held-out split
    heldout_share: float = 0.15  # share of rounds 1..R's answers held out to tune decoding and score the card

    checks = {
        "last": (lambda x: bool(ROUND_KEY.match(x)), "a quoted 4-digit round key such as '0004'"),
        "heldout_share": (lambda x: 0 < x < 1, "in (0, 1)"),
    }


SECTIONS: dict[str, type] = {
    "run": RunParams,
    "world": WorldParams,
    "base": BaseParams,
    "rollout": RolloutParams,
    "score": ScoreParams,
    "critic": CriticParams,
    "ppo": PPOParams,
    "evaluate": EvaluateParams,
}


@dataclass(frozen=True)
class Params:
    run: RunParams
    world: WorldParams
    base: BaseParams
    rollout: RolloutParams
    score: ScoreParams
    critic: CriticParams
    ppo: PPOParams
    evaluate: EvaluateParams
    rounds: dict[str, RoundParams]  # every round, also when chunked (expanded from `chunks`)
    chunks: dict[str, ChunkParams] = field(default_factory=dict)  # empty unless run.rounds_per_stage > 1
    distill: dict[str, DistillParams] = field(default_factory=dict)  # `distill@<key>` stages; {} = none
    switch: dict[str, SwitchParams] = field(default_factory=dict)  # {R: ...}: the switch-over; {} = off

    def round_keys(self) -> list[str]:
        return sorted(self.rounds)

    def switch_round(self) -> str | None:
        """R, the last round the configured critic critiques when the run switches to its own tagger; else None."""
        return next(iter(self.switch), None)

    def chunk_rounds(self, key: str) -> list[str]:
        """The round keys chunk `key` runs, in order."""
        return [f"{r:04d}" for r in range(int(key), int(self.chunks[key].last) + 1)]


def _suggest(name: str, valid) -> str:
    close = difflib.get_close_matches(name, list(valid), n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return f"{hint} Valid keys: {', '.join(valid)}."


def _type_ok(value, annotation) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is list:
        (item_t,) = typing.get_args(annotation)
        return isinstance(value, list) and all(_type_ok(v, item_t) for v in value)
    if origin is dict:
        key_t, val_t = typing.get_args(annotation)
        return isinstance(value, dict) and all(
            _type_ok(k, key_t) and _type_ok(v, val_t) for k, v in value.items()
        )
    return isinstance(value, annotation)


def _type_name(annotation) -> str:
    return str(annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")


def build_section(cls: type, values: dict, prefix: str):
    """Check a mapping against a section dataclass and return the frozen instance."""
    if not isinstance(values, dict):
        raise ConfigError(f"'{prefix}' must be a mapping of keys to values, got {values!r}.")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key, value in values.items():
        if key not in names:
            raise ConfigError(f"Unknown key '{prefix}.{key}'.{_suggest(key, names)}")
        if not _type_ok(value, hints[key]):
            raise ConfigError(
                f"'{prefix}.{key}' = {value!r} has the wrong type: expected {_type_name(hints[key])}."
            )
        check = getattr(cls, "checks", {}).get(key)
        if check and value is not None and not check[0](value):
            raise ConfigError(f"'{prefix}.{key}' = {value!r} is out of range: must be {check[1]}.")
    coerced = {k: float(v) if hints[k] is float else v for k, v in values.items()}
    return cls(**coerced)


def _check_distill(distill) -> dict[str, DistillParams]:
    """`distill: {name: {spans, ...}}`: one tagger per name, written to critics/<name> by its DVC stage."""
    if not isinstance(distill, dict):
        raise ConfigError(f"'distill' must map model names to {{spans: FILE}} (or be {{}}); got {distill!r}.")
    built = {}
    for key, spec in distill.items():
        if not isinstance(key, str) or not DISTILL_KEY.match(key):
            raise ConfigError(f"distill key {key!r} must be a folder name of letters, digits, '-' or '_' "
                              "(the tagger is written to critics/<key>).")
        if not isinstance(spec, dict) or "spans" not in spec:
            raise ConfigError(f"'distill.{key}' needs spans: a labelled span file (.csv or .jsonl).")
        built[key] = build_section(DistillParams, spec, f"distill.{key}")
    return built


def _check_rounds(rounds) -> dict[str, RoundParams]:
    if not isinstance(rounds, dict) or not rounds:
        raise ConfigError("'rounds' must map round keys like '0001' to {prev: ...}; got none "
                          "(`drlc rounds N` writes the chain).")
    built = {}
    for key, spec in rounds.items():
        if not isinstance(key, str) or not ROUND_KEY.match(key):
            raise ConfigError(f"Round key {key!r} must be a quoted 4-digit string such as '0001'.")
        built[key] = build_section(RoundParams, spec, f"rounds.{key}")
    keys = sorted(built)
    for i, key in enumerate(keys):
        expected = "base" if i == 0 else f"round={keys[i - 1]}"
        if built[key].prev != expected:
            raise ConfigError(
                f"'rounds.{key}.prev' = {built[key].prev!r} breaks the chain: expected {expected!r}."
            )
    return built


def _check_chunks(chunks, rounds, per_stage: int) -> tuple[dict[str, RoundParams], dict[str, ChunkParams]]:
    """(every round, the chunks) of a chunked run: `rounds` empty, `chunks` an unbroken chain of K rounds each.

    Chunk key = its first round; `prev` = the policy it starts from (base, then the previous chunk's
    last round); `last` = its last round; every chunk holds run.rounds_per_stage rounds but the last,
    which may hold fewer.
    """
    fix = f"`drlc rounds N --per-stage {per_stage}` writes both"
    if rounds:
        raise ConfigError(f"'rounds' lists {len(rounds)} per-round stages but 'run.rounds_per_stage' = {per_stage}: "
                          f"a chunked run sets rounds: {{}} and lists its chunks under 'chunks'; {fix}.")
    if not isinstance(chunks, dict) or not chunks:
        raise ConfigError(f"'run.rounds_per_stage' = {per_stage} needs 'chunks' ({{first round: {{prev, last}}}}); "
                          f"got none: {fix}.")
    built = {}
    for key, spec in chunks.items():
        if not isinstance(key, str) or not ROUND_KEY.match(key):
            raise ConfigError(f"Chunk key {key!r} must be a quoted 4-digit string such as '0001' (its first round).")
        built[key] = build_section(ChunkParams, spec, f"chunks.{key}")
        if not ROUND_KEY.match(built[key].last):
            raise ConfigError(f"'chunks.{key}.last' = {built[key].last!r} must be a quoted 4-digit round key.")
    keys, expanded = sorted(built), {}
    for i, key in enumerate(keys):
        chunk = built[key]
        before = built[keys[i - 1]].last if i else None  # the previous chunk's last round
        want_key, want_prev = (f"{int(before) + 1:04d}", f"round={before}") if i else (key, "base")
        if key != want_key or chunk.prev != want_prev:
            raise ConfigError(f"chunk '{key}' (prev {chunk.prev!r}) breaks the chain: expected chunk "
                              f"'{want_key}' with prev {want_prev!r}; {fix}.")
        size = int(chunk.last) - int(key) + 1
        if size != per_stage and not (i == len(keys) - 1 and 1 <= size < per_stage):
            raise ConfigError(f"chunk '{key}' runs {size} rounds ({key}..{chunk.last}) but 'run.rounds_per_stage' "
                              f"= {per_stage} (only the last chunk may be shorter); {fix}.")
        for r in range(int(key), int(chunk.last) + 1):
            prev = chunk.prev if r == int(key) else f"round={r - 1:04d}"
            expanded[f"{r:04d}"] = RoundParams(prev=prev)
    return expanded, built


def _check_switch(switch, raw: dict, critic: CriticParams, per_stage: int):
    """(every round, {R: SwitchParams}) of a switched run: `switch: {R: {last, ...}}`, `rounds` and `chunks` empty.

    Rounds 1..R run in one stage with the configured critic, R+1..last in one stage with the tagger
    trained on rounds 1..R's answers (docs/tagger.md); each needs at least one round.
    """
    fix = "`drlc rounds N --switch-after R` writes it"
    if not isinstance(switch, dict) or len(switch) != 1:
        raise ConfigError(f"'switch' must be {{}} (off) or one entry {{R: {{last: N}}}} (the configured critic through "
                          f"round R, then the run's own tagger); got {switch!r}: {fix}.")
    (key, spec), = switch.items()
    if not isinstance(key, str) or not ROUND_KEY.match(key):
        raise ConfigError(f"Switch key {key!r} must be a quoted 4-digit round key such as '0002' (R: the last round "
                          f"of the configured critic).")
    built = build_section(SwitchParams, spec, f"switch.{key}")
    if raw.get("rounds") or raw.get("chunks") or per_stage != 1:
        raise ConfigError(f"'switch.{key}' runs rounds 0001..{key} and {int(key) + 1:04d}..{built.last} in one stage "
                          f"each: set rounds: {{}}, chunks: {{}} and run.rounds_per_stage: 1; {fix}.")
    if not critic.enabled:
        raise ConfigError(f"'switch.{key}' trains a tagger on the critic's answers, but 'critic.enabled' is false: "
                          f"set critic.enabled: true, or switch: {{}} for the sparse baseline.")
    if int(key) < 1 or int(key) >= int(built.last):
        raise ConfigError(f"'switch.{key}': R = {key} must be a round before the last ('switch.{key}.last' = "
                          f"'{built.last}'), so the tagger has rounds to critique: use R in "
                          f"0001..{int(built.last) - 1:04d}.")
    rounds = {f"{r:04d}": RoundParams(prev="base" if r == 1 else f"round={r - 1:04d}")
              for r in range(1, int(built.last) + 1)}
    return rounds, {key: built}


def apply_override(raw: dict, assignment: str) -> None:
    """Apply one `dotted.key=value` override (value parsed as YAML) to the raw mapping."""
    if "=" not in assignment:
        raise ConfigError(f"Override {assignment!r} must look like section.key=value.")
    dotted, text = assignment.split("=", 1)
    *parents, leaf = dotted.split(".")
    node = raw
    for part in parents:
        if not isinstance(node.get(part), dict):
            raise ConfigError(f"Override key '{dotted}' does not exist.{_suggest(part, node)}")
        node = node[part]
    node[leaf] = read_yaml(text)


def params_from_dict(raw: dict) -> Params:
    valid = list(SECTIONS) + ["rounds", "chunks", "distill", "switch"]
    for key in raw:
        if key not in valid:
            raise ConfigError(f"Unknown section '{key}' in params.{_suggest(key, valid)}")
    sections = {name: build_section(cls, raw.get(name, {}), name) for name, cls in SECTIONS.items()}
    per_stage = sections["run"].rounds_per_stage
    if raw.get("switch", {}) != {}:
        rounds, switch = _check_switch(raw["switch"], raw, sections["critic"], per_stage)
        params = Params(**sections, rounds=rounds, switch=switch)
    elif per_stage == 1:
        if raw.get("chunks"):
            raise ConfigError("'chunks' is set but 'run.rounds_per_stage' = 1: set chunks: {} (one stage per round "
                              "and step), or `drlc rounds N --per-stage K` for chunks of K rounds.")
        params = Params(**sections, rounds=_check_rounds(raw.get("rounds")))
    else:
        rounds, chunks = _check_chunks(raw.get("chunks"), raw.get("rounds"), per_stage)
        params = Params(**sections, rounds=rounds, chunks=chunks)
    params = dataclasses.replace(params, distill=_check_distill(raw.get("distill", {})))
    last = f"round={params.round_keys()[-1]}"
    if params.evaluate.policy != last:
        raise ConfigError(
            f"'evaluate.policy' = {params.evaluate.policy!r} must name the last round: {last!r}."
        )
    _check_combinations(params)
    return params


def _check_combinations(params: Params) -> None:
    """Constraints between keys of different sections that a later stage relies on."""
    r, w, b, ppo = params.rollout, params.world, params.base, params.ppo
    _check_voting(params.critic)
    _check_server(params.critic)
    if r.min_new_tokens is not None and r.min_new_tokens > r.max_new_tokens:
        raise ConfigError(f"'rollout.min_new_tokens' = {r.min_new_tokens} exceeds "
                          f"'rollout.max_new_tokens' = {r.max_new_tokens}.")
    if w.prefix_min_words > w.prefix_max_words:
        raise ConfigError(f"'world.prefix_min_words' = {w.prefix_min_words} exceeds "
                          f"'world.prefix_max_words' = {w.prefix_max_words}.")
    if r.batch_size % ppo.backward_batch_size:
        raise ConfigError(
            f"'rollout.batch_size' = {r.batch_size} is not a multiple of 'ppo.mini_batch_size' x "
            f"'ppo.gradient_accumulation_steps' = {ppo.mini_batch_size} x {ppo.gradient_accumulation_steps}: "
            f"PPO splits each round's batch into equal minibatches; {_batch_fix(r.batch_size, ppo)} or make "
            f"rollout.batch_size a multiple of {ppo.backward_batch_size}.")
    _check_algorithm(r, ppo)
    if ppo.num_shared_layers is not None and b.lora_r > 0:
        raise ConfigError(f"'ppo.num_shared_layers' = {ppo.num_shared_layers} and 'base.lora_r' = {b.lora_r} exclude "
                          f"each other: LoRA already freezes every base weight; set num_shared_layers to null.")
    if ppo.num_shared_layers is not None and b.model is None and ppo.num_shared_layers >= b.n_layer:
        raise ConfigError(f"'ppo.num_shared_layers' = {ppo.num_shared_layers} leaves no block of the built base model "
                          f"('base.n_layer' = {b.n_layer}) to train: use a value below {b.n_layer} or null.")


def _check_server(c: CriticParams) -> None:
    """critic.server against the endpoint and the answer format (pipeline/critic/servers.py)."""
    if c.endpoint == "local" and c.server not in ("auto", "drlc"):
        raise ConfigError(f"'critic.server' = {c.server} but 'critic.endpoint' = local is drlc's own server: set "
                          f"critic.server: auto (or drlc), or critic.endpoint to the {c.server} server's URL.")
    if c.server == "openai" and c.answer_format in ("copy", "copy_words"):
        raise ConfigError(f"'critic.answer_format' = {c.answer_format} needs a server that takes a grammar, and "
                          f"'critic.server' = openai takes none: use critic.answer_format: json, or a vllm, sglang "
                          f"or llama.cpp server.")


def _check_voting(c: CriticParams) -> None:
    """critic.samples > 1 needs sampling (temperature > 0) and a vote_min it can reach."""
    if c.samples > 1 and c.temperature == 0:
        raise ConfigError(f"'critic.samples' = {c.samples} at 'critic.temperature' = 0 asks the same greedy answer "
                          f"{c.samples} times: set critic.temperature > 0 (e.g. 0.7) or critic.samples: 1.")
    if c.vote_min is not None and c.vote_min > c.samples:
        raise ConfigError(f"'critic.vote_min' = {c.vote_min} exceeds 'critic.samples' = {c.samples}: "
                          f"use a value in 1..{c.samples} or null (a majority).")


def _check_algorithm(r: RolloutParams, ppo: PPOParams) -> None:
    """ppo.algorithm against the rollout's groups and the value head (docs/algorithms.md)."""
    if r.batch_size % r.samples_per_prompt:
        raise ConfigError(f"'rollout.batch_size' = {r.batch_size} is not a whole number of groups of "
                          f"'rollout.samples_per_prompt' = {r.samples_per_prompt}: make batch_size a multiple of it.")
    if ppo.algorithm in ("grpo", "rloo") and r.samples_per_prompt < 2:
        raise ConfigError(f"'ppo.algorithm' = {ppo.algorithm} needs 'rollout.samples_per_prompt' >= 2, got "
                          f"{r.samples_per_prompt}: a group of one response has no baseline.")
    if ppo.algorithm != "ppo" and ppo.vf_coef != 0:
        raise ConfigError(f"'ppo.vf_coef' = {ppo.vf_coef} trains a value head, but 'ppo.algorithm' = {ppo.algorithm} "
                          f"is value-free and has none: set ppo.vf_coef: 0.")


def _batch_fix(batch_size: int, ppo: PPOParams) -> str:
    """The nearest smaller ppo.mini_batch_size that fits batch_size, or the accumulation to change."""
    fits = [m for m in range(1, ppo.mini_batch_size + 1) if batch_size % (m * ppo.gradient_accumulation_steps) == 0]
    if fits:
        return f"set ppo.mini_batch_size: {fits[-1]}"
    return f"set ppo.gradient_accumulation_steps to a divisor of {batch_size}"


def load_params(path: str | Path = "params.yaml", overrides: list[str] | tuple = ()) -> Params:
    """Read, override and validate a params file. Raises ConfigError on any bad value."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"Params file '{path}' not found in {Path.cwd()}: fix the path, or run from the "
                          f"project root for the default params.yaml.")
    try:
        raw = read_yaml(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"Params file '{path}' is not valid YAML: {yaml_error_line(err)}") from None
    for assignment in overrides:
        apply_override(raw, assignment)
    return params_from_dict(raw)
