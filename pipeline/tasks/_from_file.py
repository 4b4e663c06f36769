"""A task from the user's own file: ``run.task: tasks/concepts.py`` (or the module ``tasks.concepts``).

The file lives in the project's ``tasks/`` folder; the stages that run a task (prepare, score,
critique, evaluate, chunk) depend on the file, the ``tasks/`` modules it imports and its template
(pipeline/tasks/_deps.py): an edit of the reward or a helper re-runs score onwards, and rollout only
if the prompts change. It defines the reward in TRL's convention, batched::

    def reward(prompts, completions, **columns) -> list[float]   # `score.scorer: reward`

or several, declared with their weights (pipeline/tasks/_rewards.py: ``REWARDS``, ``REWARD_WEIGHTS``,
None = does not apply, async, dict returns). ``prompts`` are the query texts, ``completions`` the
responses, and ``columns`` the prompt rows' other fields, one list per field (a concept list, a
reference, ...), with ``score.settings``. Everything else is optional, each with a default:

- ``prompt(record) -> dict``: a record of ``world.source`` -> ``{"prompt": text, **columns}``
  (default: the record itself; the text is its ``prompt`` or ``text`` field);
- ``RANGE = (low, high)``: the total's bounds, in the task's units as every reward is (``score.scale``
  applies after, pipeline/rewards/shaping.py), for ``drlc estimate`` (default: unbounded);
- ``LABELS = (...)``: the span labels its critic may name; a template with another label is
  refused (default: any label);
- ``critic_fields(row) -> dict``: the template's placeholders for a scored rollout row
  (default: ``query`` and ``response``);
- ``critic(query, response) -> {label: [span, ...]}``: a rule critic, served by the local
  server's ``rules`` backend (``critic.backend: rules``, ``critic.model_dir``: the file);
- ``metrics(prompts, completions, **columns) -> {name: value}``: evaluation metrics next to the
  reward's mean, perplexity and dist-n.

With ``world.source: world`` the prompts are openings of the synthetic review world (the
demo's); else the records of the source, split seeded into train and eval, or, with
``world.eval_source``, train from the one and eval from the other.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from pipeline.core.errors import ConfigError, DataError, RewardError
from pipeline.core.code_deps import code_sha
from pipeline.core.user_code import import_file, where
from pipeline.tasks._deps import task_path  # noqa: F401 (pipeline.tasks.get_task reads it here)

TASK_FOLDER = "tasks"  # the project folder DVC tracks as user task code (dvc.yaml)
TEXT_FIELDS = ("prompt", "text")  # a record's prompt text, first found, when the file has no prompt()
DEFAULT_SCORER = "reward"
WORLD_OPENING = "The film"  # a record of the synthetic world (world.source: world) for `drlc check`'s columns
CHECK_SAMPLE = 64  # records of each prompt source that `drlc check` reads for the columns the rewards need


def load_task_file(spec: str, root: str | Path = ".") -> "FileTask":
    """The task of `spec`, checked to lie in the project's tasks/ folder and to import.

    Raises ConfigError naming `run.task` and the fix: a missing file, one outside tasks/, or one
    whose import fails (with the file's line).
    """
    path = task_path(spec, root)
    if not path.is_file():
        raise ConfigError(f"'run.task' = {spec!r}: no file {path}; write one with `drlc task new NAME` "
                          f"(tasks/NAME.py) or name a built-in task.")
    folder = (Path(root) / TASK_FOLDER).resolve()
    if folder not in path.resolve().parents:
        raise ConfigError(f"'run.task' = {spec!r} lies outside {TASK_FOLDER}/, the folder DVC tracks for the "
                          f"stages that run a task: move it (and the modules it imports) into {TASK_FOLDER}/.")
    _check_not_shadowing(spec, path)
    return FileTask(spec, path, import_file(path, key="run.task"), root=Path(root))


def _check_not_shadowing(spec: str, path: Path) -> None:
    """Raise ConfigError when the file's name is an installed module's (tasks/datasets.py): drlc puts tasks/ on
    sys.path, so a helper's `import datasets` anywhere in the process would get one or the other."""
    if shadowed_module(path.stem):
        raise ConfigError(f"'run.task' = {spec!r}: {path.stem!r} is the name of an installed module, which {path} "
                          f"would shadow for every later import: rename the file (e.g. {path.stem}_task.py).")


def shadowed_module(name: str) -> bool:
    """True when `name` is a built-in, standard-library or installed module (a project's tasks/ folder not counted)."""
    import importlib.machinery
    import sys

    path = [p for p in sys.path if Path(p or ".").name != TASK_FOLDER]
    return name in sys.builtin_module_names or importlib.machinery.PathFinder.find_spec(name, path) is not None


class FileTask:
    """A user's task file seen through the task interface of pipeline/tasks (the nine names)."""

    MODEL_SCORERS = ()
    DATA_SCORERS = ()
    EVAL_NEEDS_REFERENCES = False

    def __init__(self, spec: str, path: Path, module, *, root: Path = Path(".")) -> None:
        self.spec, self.path, self.module, self.root = spec, path, module, root
        self.name = path.stem
        self.LABELS = tuple(getattr(module, "LABELS", ()) or ())
        self.SCORERS = (DEFAULT_SCORER,)  # the weighted total of REWARDS, or the function `reward`
        self.LOADS_MODELS = bool(getattr(module, "MODELS", None))  # its rewards run models on run.device
        self.critic_fields = getattr(module, "critic_fields", _query_and_response)

    def __repr__(self) -> str:
        return f"FileTask({self.spec!r})"

    def reward_function(self, name: str, settings: dict | None = None) -> list:
        """The file's declared rewards (pipeline/tasks/_rewards.py Reward) for `score.scorer` = "reward", weighted
        with `settings` (score.settings) where REWARD_WEIGHTS names one."""
        from pipeline.tasks._rewards import declared_rewards

        if name != DEFAULT_SCORER:
            raise ConfigError(f"'score.scorer' = {name!r}: a task file's reward is {DEFAULT_SCORER!r} (the weighted "
                              f"total of its REWARDS, or its function reward): set score.scorer: {DEFAULT_SCORER}.")
        return declared_rewards(self.module, self.path, settings)

    # -- the task interface ------------------------------------------------------------------------
    def build(self, world, *, seed: int) -> tuple[list[str], dict[str, list[dict]]]:
        """(corpus, {"train": prompts, "eval": prompts}): see the module docstring for the sources."""
        from pipeline.data.local import read_records, split_items

        if world.source == "world":
            from pipeline.data.world import generate_reviews, review_prefixes
            from pipeline.tasks import prefix_prompt_splits

            splits = prefix_prompt_splits(review_prefixes, world, seed=seed)
            return generate_reviews(world.n_reviews, seed=seed), {
                split: [self._prompt_row({"text": p["text"]}, i, world.source) for i, p in enumerate(rows)]
                for split, rows in splits.items()}
        rows = [self._prompt_row(r, i, world.source) for i, r in enumerate(read_records(world.source))]
        if world.eval_source:
            eval_rows = [self._prompt_row(r, i, world.eval_source) for i, r in enumerate(read_records(world.eval_source))]
            splits = _separate_splits(rows, eval_rows, world, seed=seed)
        else:
            splits = split_items(_unique(rows), n_train=world.n_train_prompts, n_eval=world.n_eval_prompts,
                                 seed=seed, source=world.source)
        corpus = [" ".join(t.split()) for t in [r["text"] for r in rows] + [r["reference"] for r in rows] if t.strip()]
        return corpus[:world.n_reviews], splits

    def eval_prompt_rows(self, source: str, n_prompts: int | None = None) -> list[dict]:
        """Rows {prompt_id, text, reference, columns} of an evaluation prompts file (evaluate.prompts), built by the
        file's prompt() as the training prompts are: the same text and the same columns reach the reward."""
        from pipeline.data.local import read_records

        records = read_records(source)[:n_prompts]
        if not records:
            raise DataError(f"Prompts file '{source}' (evaluate.prompts) has no prompts.")
        return [{"prompt_id": str(i), **self._prompt_row(record, i, source)} for i, record in enumerate(records)]

    def _prompt_row(self, record: dict, index: int, source: str) -> dict:
        """A prompts-table row {text, reference, columns (JSON)} from one source record."""
        make = getattr(self.module, "prompt", None)
        row = dict(record)
        if make is not None:
            try:
                row = make(dict(record))
            except Exception as error:
                raise DataError(f"prompt() of {self.path} raised on record {index} of {source}"
                                f"{where(error, self.path)}: {type(error).__name__}: {error}") from error
            if not isinstance(row, dict):
                raise DataError(f"prompt() of {self.path} returned {type(row).__name__} for record {index} of "
                                f"{source}: return a dict {{'prompt': text, **columns}}.")
        if make is None and isinstance(row.get("prompt"), dict) and isinstance(row["prompt"].get("text"), str):
            row = {**row, "prompt": row["prompt"]["text"]}  # a DExperts record: {"prompt": {"text": ...}}
        key = next((k for k in TEXT_FIELDS if isinstance(row.get(k), str)), None)
        if key is None:
            raise DataError(f"Record {index} of {source} has no prompt text (a string field {list(TEXT_FIELDS)}; "
                            f"found {sorted(row)}): define prompt(record) in {self.path} to build it.")
        columns = {k: v for k, v in row.items() if k != key}
        try:
            encoded = json.dumps(columns, sort_keys=True, ensure_ascii=False)
        except TypeError as error:
            raise DataError(f"Record {index} of {source}: its columns must be JSON values ({error}).") from error
        return {"text": row[key], "reference": str(columns.get("reference") or ""), "columns": encoded}

    def check_reward_inputs(self, params, sample: int = CHECK_SAMPLE) -> None:
        """Raise ConfigError when a reward names an argument (no default) that neither score.settings nor the
        columns of every prompt source supply: the training prompts and each evaluation set, read through
        prompt() as the stages read them (the first `sample` records of each)."""
        world = params.world
        sources = {"world.source": world.source, "world.eval_source": world.eval_source,
                   **{f"evaluate.prompts[{i}]": s for i, s in enumerate(params.evaluate.prompts) if s != "world"}}
        for key, source in sources.items():
            if not source:
                continue
            # the synthetic world's openings are {"text": opening} records, as build() passes them to prompt()
            rows = [self._prompt_row({"text": WORLD_OPENING}, 0, source)] if source == "world" \
                else self.eval_prompt_rows(source, sample)
            columns = {name for row in rows for name in json.loads(row["columns"])}
            for reward in self.reward_function(params.score.scorer, params.score.settings):
                missing = sorted(reward.required() - columns - set(params.score.settings)
                                 - set(getattr(self.module, "MODELS", None) or {}))
                if missing:
                    raise ConfigError(f"Reward {reward.name} of {self.path} reads {missing}, which the prompts of "
                                      f"'{key}' = {source!r} lack (their columns: {sorted(columns)}): return it from "
                                      f"prompt(record) for every source, set it in score.settings, or give it a default.")

    def make_reward(self, score) -> "FileReward":
        return FileReward(self, score.scorer or DEFAULT_SCORER, score.settings)

    def reward_range(self, score) -> tuple[float | None, float | None]:
        """The file's RANGE: its total's bounds in the task's units (None, None when it declares none)."""
        return tuple(getattr(self.module, "RANGE", (None, None)))

    def make_evaluator(self, evaluate, reward, *, seed: int) -> "FileEvaluator":
        return FileEvaluator(self)


def _query_and_response(row: dict) -> dict[str, str]:
    return {"query": row["query"], "response": row["response"]}


def _unique(rows: list[dict]) -> list[dict]:
    """Rows with a prompt text seen before dropped (CommonGen repeats each concept set once per target)."""
    seen, kept = set(), []
    for row in rows:
        if row["text"] not in seen:
            seen.add(row["text"])
            kept.append(row)
    return kept


def _separate_splits(train: list[dict], evaluation: list[dict], world, *, seed: int) -> dict[str, list[dict]]:
    """Train prompts from world.source and eval prompts from world.eval_source, each shuffled (seeded); an eval
    prompt whose text is also a train prompt's is dropped, so evaluation reads only prompts training never saw."""
    import random

    train = _unique(train)
    texts = {row["text"] for row in train}
    evaluation = [row for row in _unique(evaluation) if row["text"] not in texts]
    if not train or not evaluation:
        empty = "world.source" if not train else "world.eval_source (after dropping prompts also in training)"
        raise DataError(f"'{empty}' gives no prompts: point it at a file of prompts.")
    draw = random.Random(f"drlc-split:{seed}")
    draw.shuffle(train)
    draw.shuffle(evaluation)
    return {"train": train[:world.n_train_prompts], "eval": evaluation[:world.n_eval_prompts]}


def columns_of(prompt_rows: list[dict]) -> dict[str, list]:
    """{field: one value per row} of the rows' JSON `columns` (a field some rows lack is None there)."""
    decoded = [json.loads(row.get("columns") or "{}") for row in prompt_rows]
    names = sorted({name for columns in decoded for name in columns})
    return {name: [columns.get(name) for columns in decoded] for name in names}


class FileReward:
    """The task file's rewards, called on batches as a built-in reward's ``score``: their weighted total, in the
    task's units (``score.scale`` applies afterwards, in pipeline/rewards/shaping.py).

    ``score`` returns the totals; ``score_terms`` also each reward's own values (and a dict reward's
    extra numbers), which the score stage stores beside the total (the scores table's ``rewards``).
    """

    needs_queries = True
    needs_columns = True

    def __init__(self, task: FileTask, scorer: str, settings: dict | None = None) -> None:
        self.task, self.rewards, self.settings = task, task.reward_function(scorer, settings), dict(settings or {})
        self.name = f"{task.name}.{scorer}"
        # an edit of the file, or of a tasks/ module it imports, shows in every score row
        self.version = code_sha(task.path, root=task.root)
        self.models = LoadedModels(task, self)
        self.device = None  # where its MODELS were loaded (holder_device); None until one is

    def to(self, device) -> "FileReward":
        """Where its MODELS load (the stage's run.device); nothing loads here (place() calls this)."""
        self.models.device = device
        return self

    def score(self, texts: list[str], *, references: list[str], queries: list[str],
              columns: dict[str, list] | None = None) -> list[float]:
        ids = [f"#{i}" for i in range(len(texts))]
        return self.score_terms(texts, ids=ids, queries=queries, columns=columns)[0]

    def score_terms(self, texts: list[str], *, ids: list[str], queries: list[str],
                    columns: dict[str, list] | None = None) -> tuple[list[float], list[dict[str, float | None]]]:
        """(weighted totals, per response {reward name: value or None, "name.key": a dict reward's extra
        number}).

        Each reward's None (does not apply) is left out of that response's total, as TRL does; a
        response no reward applies to raises RewardError naming it. ``async def`` rewards run concurrently.
        """
        from pipeline.tasks._rewards import call_rewards, weighted_totals

        values = call_rewards(self.rewards, list(queries), list(texts), dict(columns or {}), path=self.task.path,
                              settings=self.settings, models=self.models)
        totals, terms = weighted_totals(self.rewards, values, ids=ids, who=f"reward {self.name} ({self.task.path})")
        return totals, terms


class LoadedModels:
    """The file's MODELS ({name: loader(device)}) as a mapping that calls each loader once, on first use."""

    def __init__(self, task: FileTask, reward: FileReward) -> None:
        self.task, self.reward, self.device, self.loaded = task, reward, None, {}
        self.loaders = getattr(task.module, "MODELS", None) or {}
        if not isinstance(self.loaders, dict) or not all(callable(f) for f in self.loaders.values()):
            raise ConfigError(f"MODELS of {task.path} = {self.loaders!r}: give {{name: loader}}, each loader a "
                              f"function of the device returning the model (def load(device): ...).")

    def __contains__(self, name) -> bool:
        return name in self.loaders

    def __getitem__(self, name: str):
        if name not in self.loaded:
            try:
                self.loaded[name] = self.loaders[name](self.device if self.device is not None else "cpu")
            except Exception as error:
                raise RewardError(f"MODELS[{name!r}] of {self.task.path} failed to load{where(error, self.task.path)}: "
                                  f"{type(error).__name__}: {error}") from error
            self.reward.device = str(self.device if self.device is not None else "cpu")
        return self.loaded[name]


class FileEvaluator:
    """The file's metrics(prompts, completions, **columns), if any, on every evaluation sample."""

    def __init__(self, task: FileTask) -> None:
        self.task = task

    def metrics(self, texts_by_prompt: list[list[str]], prompts: list[dict]) -> tuple[dict, dict]:
        function = getattr(self.task.module, "metrics", None)
        if function is None:
            return {}, {}
        k = len(texts_by_prompt[0]) if texts_by_prompt else 0
        columns = {name: [v for v in values for _ in range(k)] for name, values in columns_of(prompts).items()}
        queries = [p["text"] for p in prompts for _ in range(k)]
        try:
            values = function(queries, [t for texts in texts_by_prompt for t in texts], **columns)
        except Exception as error:
            raise RewardError(f"metrics() of {self.task.path} raised{where(error, self.task.path)}: "
                              f"{type(error).__name__}: {error}") from error
        bad = {name: value for name, value in (values or {}).items()
               if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)}
        if not isinstance(values, dict) or bad:
            raise RewardError(f"metrics() of {self.task.path} must return {{name: finite number}}, got "
                              f"{bad or type(values).__name__}.")
        return {name: float(value) for name, value in values.items()}, {}
