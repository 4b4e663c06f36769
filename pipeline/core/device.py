"""Where a stage's models run: `run.device` resolved once, and the device every stage recorded.

`resolve_device` turns the setting into one torch.device, always with an index for CUDA
("cuda:0"), so the device a stage records is the device its model's parameters report. Under
`accelerate launch` / torchrun (WORLD_SIZE > 1) each process takes its own GPU, LOCAL_RANK.
A stage that runs a model writes ``"device"`` into its metrics JSON: that device, read from the
model's parameters; ``null`` where the stage ran no model (VADER, the lexicon toxicity, the
lexicon critic, a remote critic). `stage_devices` lists them for a run, so a GPU check can
fail a run in which some stage ran its model on the CPU.

torch is imported only to resolve a device, so a stage that runs no model never imports it
(it runs `check_device` instead) and starts in well under a second.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.core.errors import ConfigError

if TYPE_CHECKING:
    import torch

FIX = "set run.device: cpu (or auto, which picks CUDA only when it is there)"


def resolve_device(setting: str = "auto") -> torch.device:
    """The torch.device for a `run.device` setting: auto, cpu, cuda or cuda:N.

    auto is CUDA when torch sees a GPU, else cpu. Under a multi-process launch (WORLD_SIZE > 1)
    "auto" and "cuda" mean this process's local GPU (LOCAL_RANK).
    Raises: ConfigError (one line with the fix) for cuda without a CUDA device, or cuda:N
    beyond the device count.
    """
    import torch

    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"run.device is {setting!r} but torch sees no CUDA device on this machine: {FIX}.")
    count = torch.cuda.device_count()
    if setting in ("auto", "cuda"):
        index = int(os.environ.get("LOCAL_RANK", "0")) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else 0
    else:
        index = int(setting.split(":")[1])
    if index >= count:
        raise ConfigError(f"run.device asks for CUDA device {index} ({setting!r}, LOCAL_RANK "
                          f"{os.environ.get('LOCAL_RANK', 'unset')}) but this machine has {count}: use cuda:0 to "
                          f"cuda:{count - 1}, or {FIX}.")
    return torch.device("cuda", index)


def check_device(params) -> None:
    """Raise resolve_device's ConfigError where `run.device` cannot be met on this machine, for a stage that
    runs no model: cuda and cuda:N are checked (importing torch), auto and cpu always can be (no import)."""
    if params.run.device not in ("auto", "cpu"):
        resolve_device(params.run.device)


def module_device(module: torch.nn.Module) -> str:
    """The device of a module's first parameter, as a string ("cpu", "cuda:0")."""
    return str(next(module.parameters()).device)


def place(model_holder, device: torch.device):
    """Move a scorer's or critic's model to `device` (its ``to``); a holder without a model passes unchanged."""
    if hasattr(model_holder, "to"):
        model_holder.to(device)
    return model_holder


def holder_device(model_holder) -> str | None:
    """The device a scorer's model sits on (its ``device`` attribute), None for a scorer without a model."""
    return getattr(model_holder, "device", None)


def stage_devices(metrics_dir: str | Path) -> dict[str, str | None]:
    """{stage@round or stage: device} from a run's metrics folder.

    Per-round stages write metrics/<stage>/round=<key>.json, a chunk stage
    metrics/<stage>/chunk=<chunk>/round=<key>.json (both keyed "stage@<key>"); every such
    file is listed, and one without a ``device`` field maps to None. A top-level
    metrics/<stage>.json is listed when it has a ``device`` field (base, evaluate; eval.json
    and rounds.json hold other things). None = the stage ran no model.
    """
    metrics_dir = Path(metrics_dir)
    devices: dict[str, str | None] = {}
    for path in sorted([*metrics_dir.glob("*/round=*.json"), *metrics_dir.glob("*/chunk=*/round=*.json")]):
        data = json.loads(path.read_text())
        stage = path.parent.parent.name if path.parent.name.startswith("chunk=") else path.parent.name
        devices[f"{stage}@{path.stem.split('=', 1)[1]}"] = data.get("device")
    for path in sorted(metrics_dir.glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "device" in data:
            devices[path.stem] = data["device"]
    return devices
