"""Content-hashed disk cache of paid remote answers: the critic's, and a remote scorer's (Perspective).

It sits in core because two layers pay per call: the critic (pipeline/critic/client.py) and the
environment rewards (pipeline/rewards/perspective.py, under its own namespace).

A critic answer is stored under :func:`cache_key`, the SHA-256 of what determines the
answer: the model, the full messages, the sampling parameters, the sample index, the
SHA-256 of the template that rendered the messages and an optional namespace. The
endpoint's host and port are not part of it (a local critic server restarted on another
port still hits), nor the API key or headers. A re-run, a resumed run or a PPO-only
experiment therefore makes no API call. Only successful answers are stored (never a
failure; an answer cut off at ``max_tokens`` is stored with its ``finish_reason``), the first stored answer for a key is
canonical (a temperature-0 critic is not deterministic), and nothing is ever evicted. The
store is a :class:`diskcache.Cache`, safe to share between processes; hit, miss and
request counters live in the same directory, so ``drlc cache stats`` reports totals over
every process that used it.

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as tmp, CriticCache(tmp) as cache:
...     key = cache_key(model="m", messages=[{"role": "user", "content": "hi"}], template_sha="",
...                     temperature=0.0)
...     cache.put(key, {"raw_text": "ok", "finish_reason": "stop",
...                     "usage": {"prompt_tokens": 1, "completion_tokens": 1},
...                     "model": "m", "system_fingerprint": None, "latency_s": 0.1})
...     cache.get(key)["raw_text"], cache.stats()["entries"]
True
('ok', 1)
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import diskcache

from pipeline.core.errors import CacheError, StoreError

EXPERIMENT_COPIES = (".dvc", "tmp", "exps")  # where DVC runs queued and --temp experiments: <project>/.dvc/tmp/exps/...


def experiment_workspace(cwd: str | Path | None = None) -> Path | None:
    """``<project>`` when `cwd` (default: the current folder) is a DVC experiment copy of it, else None.

    A queued (or ``--temp``) experiment runs in a copy of the project under ``<project>/.dvc/tmp/exps/``.

    >>> str(experiment_workspace("/p/.dvc/tmp/exps/standalone/tmpcd34")), experiment_workspace("/p")
    ('/p', None)
    """
    parts = Path(cwd if cwd is not None else Path.cwd()).parts
    n = len(EXPERIMENT_COPIES)
    for i in range(len(parts) - n, 0, -1):
        if parts[i:i + n] == EXPERIMENT_COPIES:
            return Path(*parts[:i])
    return None


def shared_directory(directory: str | Path, cwd: str | Path | None = None) -> Path:
    """The cache folder a relative ``directory`` names: the workspace's, also inside a DVC experiment copy.

    The copy lacks git-ignored folders such as ``cache/critic``; there a relative directory is resolved
    against ``<project>``, so every experiment, arm and seed reads and writes the workspace's one cache.
    Elsewhere, and for an absolute directory, it is returned as given.

    >>> str(shared_directory("cache/critic", "/p/.dvc/tmp/exps/tmpab12"))
    '/p/cache/critic'
    >>> str(shared_directory("cache/critic", "/p/.dvc/tmp/exps/standalone/tmpcd34"))
    '/p/cache/critic'
    >>> str(shared_directory("cache/critic", "/p")), str(shared_directory("/abs/c", "/p/.dvc/tmp/exps/t"))
    ('cache/critic', '/abs/c')
    """
    path = Path(directory)
    workspace = None if path.is_absolute() else experiment_workspace(cwd)
    return workspace / path if workspace else path


def outside_path(source: str, cwd: str | Path | None = None) -> str:
    """A relative path that leaves the project (``../shared/data/x.txt``), as the workspace resolves it.

    An experiment copy holds the project's own files, so a path inside the project reads the copy's; one
    that starts with ``..`` would point beside the copy, where nothing is, so it is resolved against
    ``<project>`` instead: the data a profile names outside the project reads the same in every experiment.

    >>> outside_path("../shared/x.txt", "/w/p/.dvc/tmp/exps/tmpab12"), outside_path("../shared/x.txt", "/w/p")
    ('/w/p/../shared/x.txt', '../shared/x.txt')
    >>> outside_path("data/x.txt", "/w/p/.dvc/tmp/exps/tmpab12")
    'data/x.txt'
    """
    path = Path(source)
    if path.is_absolute() or not path.parts or path.parts[0] != "..":
        return source
    workspace = experiment_workspace(cwd)
    return str(workspace / path) if workspace else source


def link_outside(project: Path, name: str = "shared") -> None:
    """Make ``../<name>`` resolve in DVC's experiment copies too, for DVC's own reading of a stage's deps.

    drlc's readers go through :func:`outside_path`, but DVC resolves a dep such as ``../shared/x.csv``
    (distill's ``${item.spans}``) against the copy itself: ``<copies>/<name>``, queued or ``--temp``,
    becomes a link to ``<project>/../<name>``. Nothing is done when that folder does not exist.
    """
    outside = project.parent / name
    for folder in (Path(*EXPERIMENT_COPIES), Path(*EXPERIMENT_COPIES, "standalone")) if outside.is_dir() else ():
        link = project / folder / name
        if not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(outside.resolve(), target_is_directory=True)


__all__ = ["SCHEMA_VERSION", "MISSING", "cache_key", "CriticCache", "export_parquet", "import_parquet"]

SCHEMA_VERSION = 2
"""Bumped when the key recipe or the value layout changes; old entries then stop matching.

2: the endpoint URL left the key; the template SHA-256 and the namespace joined it.
"""

_VALUE_FIELDS = ("raw_text", "finish_reason", "usage", "model", "system_fingerprint", "latency_s")
_COUNTERS = ("hits", "misses", "requests", "saved_prompt_tokens", "saved_completion_tokens", "saved_nano_usd")
_SIZE_LIMIT = 2**50  # effectively unlimited: eviction is off anyway, this only silences culling


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()
"""Sentinel returned by :meth:`CriticCache.get` when a key is absent (``None`` could be a value)."""


def cache_key(
    *,
    model: str,
    messages: list[dict],
    template_sha: str,
    sample_index: int = 0,
    namespace: str = "",
    temperature: float | None = None,
    top_p: float | None = None,
    max_tokens: int | None = None,
    seed: int | None = None,
    stop: str | list[str] | None = None,
    n: int | None = None,
    body: dict | None = None,
) -> str:
    """Return the cache key of one critic request: a 64-character SHA-256 hex digest.

    The digest covers canonical JSON (sorted keys, UTF-8, no spaces) of the cache schema
    version, the model, the full messages, the template's SHA-256, every sampling
    parameter that is sent (``None`` means "not sent" and is left out), the sample index
    and the namespace. The endpoint URL (host, port) is not part of it, so the same
    model behind a restarted or moved server hits; the API key and HTTP headers never are.

    >>> msgs = [{"role": "user", "content": "hi"}]
    >>> a = cache_key(model="m", messages=msgs, template_sha="ab")
    >>> a == cache_key(model="m", messages=msgs, template_sha="ab", seed=1)
    False
    >>> a == cache_key(model="m", messages=msgs, template_sha="ab", namespace="team-b")
    False
    >>> len(a)
    64

    :param model: the model's identity (the name requested; drlc's local server adds its backend)
    :param messages: chat messages, each a dict with role and content
    :param template_sha: SHA-256 of the critic template that rendered ``messages`` ("" if none)
    :param sample_index: which sample of the same request this is (0 for the first)
    :param namespace: free text that separates caches (``critic.cache_namespace``; "" = shared)
    :param temperature, top_p, max_tokens, seed, stop, n: sampling parameters as sent
    :param body: other request fields sent (``critic.extra_body``, ``critic.answer_format``'s
        ``response_format``/``grammar``); None or {} adds nothing, so keys made without any stay the same
    :return: lowercase hex SHA-256 digest
    """
    sampling = {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens, "seed": seed, "stop": stop, "n": n}
    payload = {
        "schema": SCHEMA_VERSION,
        "namespace": namespace,
        "model": model,
        "template_sha": template_sha,
        "messages": messages,
        "sampling": {k: v for k, v in sampling.items() if v is not None},
        "sample_index": sample_index,
    }
    if body:
        payload["body"] = body
    canonical = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _check_value(value: Any) -> None:
    """Raise CacheError unless ``value`` is a complete, successful critic answer."""
    if not isinstance(value, dict):
        raise CacheError(f"cache value must be a dict with {list(_VALUE_FIELDS)}, got {type(value).__name__}")
    missing = [f for f in _VALUE_FIELDS if f not in value]
    if missing:
        raise CacheError(f"cache value lacks fields {missing}; a value needs {list(_VALUE_FIELDS)}")
    if not isinstance(value["raw_text"], str) or not value["raw_text"].strip():
        raise CacheError("cache value has empty raw_text; only complete successful answers are stored")
    usage = value["usage"]
    if not isinstance(usage, dict) or not {"prompt_tokens", "completion_tokens"} <= usage.keys():
        raise CacheError(f"cache value usage must hold prompt_tokens and completion_tokens, got {usage!r}")


class CriticCache:
    """Persistent, never-evicting store of critic answers keyed by :func:`cache_key`.

    Several processes may open the same directory at once. Writes retry on a busy
    database. Counters (hits, misses, requests, tokens and dollars saved) are stored in
    the directory too, so :meth:`stats` shows totals across processes and runs.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     cache = CriticCache(tmp)
    ...     cache.get("0" * 64) is MISSING, "0" * 64 in cache, cache.stats()["misses"]
    ...     cache.close()
    (True, False, 1)

    :param directory: cache directory; created if absent
    :raises CacheError: if the directory cannot be created, opened or written
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = shared_directory(directory)
        try:
            self._store = diskcache.Cache(str(self.directory), eviction_policy="none", size_limit=_SIZE_LIMIT)
            self._store.set(("drlc", "probe"), 1, retry=True)  # fail now, before any API call
            self._store.delete(("drlc", "probe"), retry=True)
        except (OSError, sqlite3.Error) as error:
            raise CacheError(
                f"critic cache directory {str(self.directory)!r} cannot be created or written ({error}); "
                "pass a writable directory (critic.cache_dir)"
            ) from error

    def get(self, key: str, default: Any = MISSING) -> Any:
        """Return the stored answer for ``key``, or ``default`` if there is none.

        Counts a hit or a miss; a hit also adds the answer's token counts to the
        "saved" totals.

        :param key: a :func:`cache_key` digest
        :param default: returned when the key is absent (the :data:`MISSING` sentinel by default)
        :return: the value dict given to :meth:`put`, or ``default``
        """
        value = self._store.get(key, default=MISSING, retry=True)
        if value is MISSING:
            self._store.incr(("drlc", "misses"), 1, retry=True)
            return default
        self._store.incr(("drlc", "hits"), 1, retry=True)
        self._store.incr(("drlc", "saved_prompt_tokens"), int(value["usage"]["prompt_tokens"]), retry=True)
        self._store.incr(("drlc", "saved_completion_tokens"), int(value["usage"]["completion_tokens"]), retry=True)
        return value

    def put(self, key: str, value: dict) -> bool:
        """Store a complete successful answer under ``key`` unless one is already stored.

        The first stored answer is canonical: a second ``put`` for the same key keeps the
        old value and returns ``False``.

        >>> import tempfile
        >>> answer = {"raw_text": "x", "finish_reason": "stop", "model": "m", "latency_s": 0.0,
        ...           "usage": {"prompt_tokens": 1, "completion_tokens": 1}, "system_fingerprint": None}
        >>> with tempfile.TemporaryDirectory() as tmp, CriticCache(tmp) as cache:
        ...     cache.put("k", answer), cache.put("k", dict(answer, raw_text="y")), cache.get("k")["raw_text"]
        (True, False, 'x')

        :param key: a :func:`cache_key` digest
        :param value: dict with raw_text (non-empty), finish_reason, usage{prompt_tokens,
            completion_tokens}, model, system_fingerprint, latency_s
        :return: ``True`` if stored, ``False`` if the key already had an answer
        :raises CacheError: if the value is incomplete or has empty raw_text
        """
        _check_value(value)
        stored = {field: value[field] for field in _VALUE_FIELDS}
        return bool(self._store.add(key, stored, retry=True))

    def __contains__(self, key: str) -> bool:
        """Return whether an answer is stored for ``key`` (counts neither hit nor miss)."""
        return key in self._store

    def tally(self, *, requests: int = 0, cost_usd_saved: float = 0.0) -> None:
        """Add to the persistent request and dollars-saved counters (called by the client).

        :param requests: API requests just sent
        :param cost_usd_saved: price of answers just served from the cache instead of the API
        """
        if requests:
            self._store.incr(("drlc", "requests"), int(requests), retry=True)
        if cost_usd_saved:
            self._store.incr(("drlc", "saved_nano_usd"), round(cost_usd_saved * 1e9), retry=True)

    def stats(self) -> dict:
        """Return counters over every process that used this directory.

        :return: dict with entries (stored answers), hits, misses, requests (API requests
            sent), prompt_tokens and completion_tokens (of answers served from the cache)
            and cost_usd_saved
        """
        counts = {name: self._store.get(("drlc", name), default=0, retry=True) for name in _COUNTERS}
        entries = sum(1 for key in self._store.iterkeys() if isinstance(key, str))
        return {
            "entries": entries,
            "hits": counts["hits"],
            "misses": counts["misses"],
            "requests": counts["requests"],
            "prompt_tokens": counts["saved_prompt_tokens"],
            "completion_tokens": counts["saved_completion_tokens"],
            "cost_usd_saved": counts["saved_nano_usd"] / 1e9,
        }

    def keys(self):
        """Yield the cache keys of stored answers (counters are skipped)."""
        return (key for key in self._store.iterkeys() if isinstance(key, str))

    def close(self) -> None:
        """Close the database connections; the data stays on disk."""
        self._store.close()

    def __enter__(self) -> "CriticCache":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_PARQUET_COLUMNS = (
    "cache_key", "raw_text", "finish_reason", "prompt_tokens", "completion_tokens",
    "model", "system_fingerprint", "latency_s",
)


def export_parquet(cache: CriticCache, path: str | Path) -> int:
    """Write every stored answer to a Parquet file so paid answers can be shared.

    :param cache: the cache to read
    :param path: output Parquet file
    :return: number of answers written
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = {name: [] for name in _PARQUET_COLUMNS}
    for key in sorted(cache.keys()):
        value = cache._store.get(key, retry=True)  # not cache.get: an export is not a hit
        rows["cache_key"].append(key)
        for name in ("raw_text", "finish_reason", "model", "system_fingerprint", "latency_s"):
            rows[name].append(value[name])
        rows["prompt_tokens"].append(int(value["usage"]["prompt_tokens"]))
        rows["completion_tokens"].append(int(value["usage"]["completion_tokens"]))
    schema = pa.schema([
        ("cache_key", pa.string()), ("raw_text", pa.string()), ("finish_reason", pa.string()),
        ("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()), ("model", pa.string()),
        ("system_fingerprint", pa.string()), ("latency_s", pa.float64()),
    ])
    pq.write_table(pa.table(rows, schema=schema), str(path))
    return len(rows["cache_key"])


def import_parquet(cache: CriticCache, path: str | Path) -> int:
    """Add the answers of a Parquet file written by :func:`export_parquet` to ``cache``.

    Keys already in the cache keep their stored answer (the first answer is canonical).

    :param cache: the cache to fill
    :param path: Parquet file with the columns of :func:`export_parquet`
    :return: number of answers newly stored
    :raises StoreError: if the file is missing, unreadable or lacks a column
    :raises CacheError: if a row is not a complete answer (e.g. empty raw_text)
    """
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(str(path))
    except (OSError, ValueError) as error:
        raise StoreError(f"cannot read critic cache export {str(path)!r} ({str(error).splitlines()[0]}); "
                         "pass a Parquet file written by `drlc cache export`") from None
    missing = [name for name in _PARQUET_COLUMNS if name not in table.column_names]
    if missing:
        raise StoreError(f"critic cache export {str(path)!r} lacks columns {missing}; write it with export_parquet")
    added = 0
    for row in table.to_pylist():
        value = {name: row[name] for name in ("raw_text", "finish_reason", "model", "system_fingerprint", "latency_s")}
        value["usage"] = {"prompt_tokens": row["prompt_tokens"], "completion_tokens": row["completion_tokens"]}
        added += cache.put(row["cache_key"], value)
    return added
