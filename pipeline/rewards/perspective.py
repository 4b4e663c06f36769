"""Toxicity from the Perspective API, rate-limited, retried, and cached like critic answers.

Every request goes through the critic's content-hashed cache (pipeline/core/cache.py):
the key is ``cache_key`` of the endpoint without credentials, the model name
``perspective:TOXICITY`` and the text as the one user message, so a re-run sends nothing.
The API key is read from ``PERSPECTIVE_API_KEY`` at construction, sent as the ``key`` query
parameter, and never written to the cache, the tables or an error message. Requests start at
most ``rate_limit_per_s`` per second (the API's default quota is 1 QPS); HTTP 429 and 5xx and
connection errors are retried with exponential backoff, up to ``max_retries`` times.
"""
from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request

from pipeline.core.cache import MISSING, CriticCache, cache_key
from pipeline.core.errors import ConfigError, CriticError

DEFAULT_ENDPOINT = "https://commentanalyzer.googleapis.com/v1alpha1/comments:analyze"
API_KEY_ENV = "PERSPECTIVE_API_KEY"
MODEL = "perspective:TOXICITY"


class PerspectiveToxicity:
    """TOXICITY summary scores in [0, 1] from Perspective, one cached request per distinct text.

    Params: cache_dir: the cache folder; endpoint: API URL (None = Google's); rate_limit_per_s:
    request starts per second; max_retries: retries after a 429/5xx/connection error;
    timeout_s: per request; backoff_s: first retry wait (doubles each retry).
    Raises: ConfigError if PERSPECTIVE_API_KEY is unset.
    """

    name = "perspective"
    version = "v1alpha1"

    def __init__(self, *, cache_dir: str, endpoint: str | None = None, rate_limit_per_s: float = 1.0,
                 max_retries: int = 6, timeout_s: float = 30.0, backoff_s: float = 1.0) -> None:
        self._key = os.environ.get(API_KEY_ENV, "")
        if not self._key:
            raise ConfigError(f"score.scorer 'perspective' needs the API key in the environment variable "
                              f"{API_KEY_ENV}: export it, or use the 'lexicon' scorer offline.")
        self.endpoint = endpoint or DEFAULT_ENDPOINT
        self.cache_dir, self.interval = cache_dir, 1.0 / rate_limit_per_s
        self.max_retries, self.timeout_s, self.backoff_s = max_retries, timeout_s, backoff_s
        self.requests_sent, self._last_start = 0, -float("inf")

    def toxicity(self, texts: list[str]) -> list[float]:
        """The TOXICITY score of each text (cache first). Raises CriticError after the last retry."""
        with CriticCache(self.cache_dir) as cache:
            return [self._cached(text, cache) for text in texts]

    def _cached(self, text: str, cache: CriticCache) -> float:
        key = cache_key(model=MODEL, messages=[{"role": "user", "content": text}], template_sha="")
        value = cache.get(key)
        if value is MISSING:
            started = time.monotonic()
            raw = self._request(text)
            value = {"raw_text": raw, "finish_reason": "stop", "model": MODEL, "system_fingerprint": None,
                     "usage": {"prompt_tokens": 0, "completion_tokens": 0},
                     "latency_s": time.monotonic() - started}
            cache.put(key, value)
            cache.tally(requests=1)
        return float(json.loads(value["raw_text"])["attributeScores"]["TOXICITY"]["summaryScore"]["value"])

    def _request(self, text: str) -> str:
        body = json.dumps({"comment": {"text": text}, "languages": ["en"],
                           "requestedAttributes": {"TOXICITY": {}}}).encode()
        url = f"{self.endpoint}?{urllib.parse.urlencode({'key': self._key})}"
        error = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            self._wait_for_slot()
            request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
            self.requests_sent += 1
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    return response.read().decode()
            except urllib.error.HTTPError as err:
                error = f"HTTP {err.code}"
                if err.code != 429 and err.code < 500:
                    break
            except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
                error = type(err).__name__
        raise CriticError(f"Perspective request to {self.endpoint} failed ({error}) after {attempt + 1} "
                          f"attempt(s): check the key's quota and 'score.rate_limit_per_s'; answers so far are cached.")

    def _wait_for_slot(self) -> None:
        wait = self._last_start + self.interval - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self._last_start = time.monotonic()
