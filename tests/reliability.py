"""Helpers for the reliability tests: one finished shrunken run, stage subprocesses, critic servers.

`shrunken_run()` builds one 1-round project with `dvc repro` (once per pytest process, shared
by every reliability test file) with OPENAI_API_KEY set to `SECRET` and the critic on a
loopback server started here, so the secrets test can scan it and the fault, crash and budget
tests can run single stages on its tables. `RecordingBackend` makes a loopback critic server
that fails chosen requests on purpose and records what it received.
"""
from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
import yaml
from e2e import make_project, tiny_params

from pipeline.core.store import VOLATILE_COLUMNS
from pipeline.critic.offline import lexicon
from pipeline.critic.offline.server import make_server

ROOT = Path(__file__).resolve().parents[1]
SECRET = f"sk-drlc-test-{secrets.token_hex(20)}"
_RUN: dict = {}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def critic_server(port: int = 0, **options):
    """A drlc critic server (pipeline.critic.offline.server.make_server options) in a thread of this process."""
    server = make_server(port=port, **options)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


class RecordingBackend:
    """A critic backend (``messages -> text``) that records every request and fails chosen ones on purpose.

    A request whose last message contains one of ``failing`` raises, which drlc's server answers
    with HTTP 500 ("backend failed: ..."); the others get the lexicon critic's answer. ``seen``
    lists the last message of every request that reached the backend, in arrival order.
    """

    __name__ = "lexicon-recording"

    def __init__(self, failing=()):
        self.failing, self.seen, self.lock = set(failing), [], threading.Lock()

    def __call__(self, messages: list[dict]) -> str:
        text = str(messages[-1]["content"])
        with self.lock:
            self.seen.append(text)
        if any(marker in text for marker in self.failing):
            raise RuntimeError("this request fails on purpose")
        return lexicon.answer(messages)


def stage_env() -> dict:
    """Environment of a stage subprocess: the shrunken run's code copy on the path, SECRET as the API key.

    Stages run the project copy's code (a snapshot taken when the run was built), so edits made
    to the repo while the tests run cannot mix two versions of the package.
    """
    code = _RUN["project"] if _RUN else ROOT
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])  # dvc runs `python`
    return dict(os.environ, PATH=path, PYTHONPATH=str(code), DVC_NO_ANALYTICS="1", TQDM_DISABLE="1",
                OPENAI_API_KEY=SECRET)


def run_logged(cmd: list[str], cwd: Path, log: Path | None = None) -> subprocess.CompletedProcess:
    """Run cmd with stage_env(); append its stdout and stderr to `log` (the captured logs)."""
    result = subprocess.run(cmd, cwd=cwd, env=stage_env(), capture_output=True, text=True)
    if log is not None:
        with log.open("a") as f:
            f.write(f"$ {' '.join(map(str, cmd))}\n{result.stdout}\n{result.stderr}\n")
    return result


def shrunken_run() -> dict:
    """A finished 1-round project (64 rollouts, critic on a loopback URL, key = SECRET).

    Returns {"project", "port", "log", "params"}; built once per process, removed at exit.
    """
    if _RUN:
        return _RUN
    reuse = os.environ.get("DRLC_RELIABILITY_RUN")  # a finished run's project dir, to iterate faster
    if reuse:
        project = Path(reuse)
        params = yaml.safe_load((project / "params.yaml").read_text())
        port = int(params["critic"]["endpoint"].rsplit(":", 1)[1].split("/")[0])
        _RUN.update(project=project, port=port, log=project.parent / "logs.txt", params=params)
        return _RUN
    tmp = Path(tempfile.mkdtemp(prefix="drlc-reliability-"))
    atexit.register(shutil.rmtree, tmp, True)
    port = free_port()
    params = tiny_params(n_rounds=1, rollout={"batch_size": 64, "generation_batch_size": 64},
                         critic={"endpoint": f"http://127.0.0.1:{port}/v1"})
    project = make_project(tmp, params)
    log = tmp / "logs.txt"
    _RUN.update(project=project, port=port, log=log, params=params)
    with critic_server(port=port):
        result = run_logged([sys.executable, "-m", "dvc", "repro"], project, log)
    if result.returncode != 0:
        _RUN.clear()
        raise AssertionError(f"shrunken run failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return _RUN


def workdir_for(tmp: Path, params: dict, **critic) -> Path:
    """A stage working dir: prompts/ and a params.yaml = `params` with critic keys overridden."""
    tmp.mkdir(parents=True, exist_ok=True)
    shutil.copytree((_RUN["project"] if _RUN else ROOT) / "prompts", tmp / "prompts", dirs_exist_ok=True)
    raw = yaml.safe_load(yaml.safe_dump(params))
    raw["critic"].update(critic)
    (tmp / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return tmp


def critique_cmd(project: Path, out: Path, metrics: Path) -> list[str]:
    """The critique stage of round 0001 on the shrunken run's tables, writing out/ and metrics."""
    return [sys.executable, str(project / "stages" / "critique.py"), "--round", "0001",
            "--rollouts", str(project / "data/rollouts/round=0001"),
            "--scores", str(project / "data/scores/round=0001"), "--tokenizer", str(project / "models/base"),
            "--out", str(out), "--metrics", str(metrics)]


def ppo_cmd(project: Path, out: Path) -> list[str]:
    """The ppo stage of round 0001 on the shrunken run's tables, writing under `out`."""
    return [sys.executable, str(project / "stages" / "ppo.py"), "--round", "0001",
            "--policy", str(project / "models/base"), "--reference", str(project / "models/base"),
            "--rollouts", str(project / "data/rollouts/round=0001"),
            "--scores", str(project / "data/scores/round=0001"),
            "--annotations", str(project / "data/annotations/round=0001"),
            "--out", str(out / "model"), "--steps", str(out / "steps"), "--kl-rewards", str(out / "kl_rewards"),
            "--metrics", str(out / "ppo.json")]


def start(cmd: list[str], cwd: Path) -> subprocess.Popen:
    """Start cmd in its own process group (so kill_group reaches its children too)."""
    return subprocess.Popen(cmd, cwd=cwd, env=stage_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the process group started by start() and reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.communicate(timeout=30)


def wait_until(predicate, timeout_s: float, process: subprocess.Popen | None = None) -> bool:
    """Poll predicate every 5 ms; False on timeout or if `process` exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        if process is not None and process.poll() is not None:
            return False
        time.sleep(0.005)
    return False


def table_rows(path: Path, table: str) -> list[dict]:
    """A partition's rows without the columns that legitimately differ between runs."""
    data = pq.read_table(path / "part-0.parquet" if path.is_dir() else path)
    drop = [c for c in VOLATILE_COLUMNS.get(table, []) if c in data.column_names]
    return data.drop(drop).to_pylist()


def assert_whole_or_absent(out_dir: Path) -> None:
    """A killed stage leaves its Parquet file complete and readable, or no file at all."""
    target = out_dir / "part-0.parquet"
    if target.exists():
        pq.read_table(target)  # raises on a truncated file
