"""The language-model client: any OpenAI-compatible chat-completions endpoint.

Off unless configured. Configuration, first found wins:
  environment  FACTDB_LLM_BASE_URL, FACTDB_LLM_MODEL, FACTDB_LLM_API_KEY
  file         $FACTDB_HOME/llm.yaml with keys base_url, model, api_key (and optional limits:
               max_calls, max_tokens, max_wall_s, timeout_s, retries)
With `offline=True` or no configuration, `LLM.open` returns None and nothing opens a socket.

Limits are per run (one LLM object): calls, tokens, wall time. 429 and 5xx are retried with
exponential backoff; replies are cached on disk by the hash of the prompt, so a rerun with
the same prompt costs no call.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fact_db.core import paths
from fact_db.core.errors import FactError


class LLMError(FactError):
    """The endpoint could not give a reply (limits spent, retries exhausted, timeout)."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason  # "timeout", "limit", "http", "unreachable"


@dataclass
class Config:
    base_url: str
    model: str
    api_key: str = "none"
    max_calls: int = 20
    max_tokens: int = 200_000
    max_wall_s: float = 600.0
    timeout_s: float = 120.0
    retries: int = 4
    backoff_s: float = 1.0


def load_config() -> Config | None:
    """The configuration from the environment or $FACTDB_HOME/llm.yaml, or None (off)."""
    env = os.environ
    if env.get("FACTDB_LLM_BASE_URL") and env.get("FACTDB_LLM_MODEL"):
        return Config(env["FACTDB_LLM_BASE_URL"], env["FACTDB_LLM_MODEL"], env.get("FACTDB_LLM_API_KEY") or "none")
    f = paths.home() / "llm.yaml"
    if not f.exists():
        return None
    data = yaml.safe_load(f.read_text()) or {}
    if not isinstance(data, dict) or not data.get("base_url") or not data.get("model"):
        raise FactError(f"{f}: needs `base_url` and `model` (and `api_key` if the endpoint wants one); "
                        "fix the file or remove it to turn the agent off")
    known = set(Config.__dataclass_fields__)
    bad = sorted(set(data) - known)
    if bad:
        raise FactError(f"{f}: unknown key(s) {', '.join(bad)}; allowed: {', '.join(sorted(known))}")
    return Config(**data)


@dataclass
class Usage:
    calls: int = 0  # requests that reached the endpoint (retries included)
    cached: int = 0  # replies served from the cache
    tokens: int = 0
    served: list = field(default_factory=list)  # region names the calls were for

    def as_dict(self) -> dict:
        return {"calls": self.calls, "cached": self.cached, "tokens": self.tokens, "served": list(self.served)}


class LLM:
    def __init__(self, config: Config, cache_dir: Path | None = None):
        self.config = config
        self.cache_dir = Path(cache_dir or paths.home() / "llm-cache")
        self.usage = Usage()
        self._t0 = time.monotonic()
        self._client = None

    @classmethod
    def open(cls, *, offline: bool = False, config: Config | None = None) -> "LLM | None":
        """The client, or None when offline or unconfigured (then nothing opens a socket)."""
        if offline:
            return None
        config = config or load_config()
        return cls(config) if config else None

    def _key(self, messages: list) -> str:
        blob = json.dumps({"model": self.config.model, "messages": messages}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def _openai(self):
        if self._client is None:
            import openai  # imported only when a call is really made

            self._client = openai.OpenAI(base_url=self.config.base_url, api_key=self.config.api_key,
                                         timeout=self.config.timeout_s, max_retries=0)
        return self._client

    def chat(self, messages: list, *, region: str = "") -> str:
        """The reply text for `messages`, from the cache or the endpoint."""
        key = self._key(messages)
        cached = self.cache_dir / f"{key}.json"
        if cached.exists():
            self.usage.cached += 1
            return json.loads(cached.read_text())["reply"]
        import openai

        c = self.config
        delay = c.backoff_s
        last = ""
        for attempt in range(c.retries + 1):
            if self.usage.calls >= c.max_calls:
                raise LLMError(f"call limit reached ({c.max_calls} per run); raise max_calls in llm.yaml", "limit")
            if self.usage.tokens >= c.max_tokens:
                raise LLMError(f"token limit reached ({c.max_tokens} per run); raise max_tokens in llm.yaml", "limit")
            if time.monotonic() - self._t0 > c.max_wall_s:
                raise LLMError(f"wall-time limit reached ({c.max_wall_s:.0f} s per run); raise max_wall_s in llm.yaml", "limit")
            self.usage.calls += 1
            if region and region not in self.usage.served:
                self.usage.served.append(region)
            try:
                r = self._openai().chat.completions.create(model=c.model, messages=messages, stream=False,
                                                           temperature=0)
            except openai.APITimeoutError:
                raise LLMError(f"no reply from {c.base_url} within {c.timeout_s:.0f} s", "timeout") from None
            except openai.APIStatusError as e:
                last = f"HTTP {e.status_code}"
                if e.status_code == 429 or e.status_code >= 500:
                    if attempt < c.retries:
                        time.sleep(delay)
                        delay *= 2
                        continue
                    raise LLMError(f"{c.base_url} answered {last} after {attempt + 1} attempts; try again later", "http") from None
                raise LLMError(f"{c.base_url} refused the request: {last}: {e.message}", "http") from None
            except openai.APIConnectionError as e:
                raise LLMError(f"cannot reach {c.base_url}: {e}", "unreachable") from None
            if r.usage is not None:
                self.usage.tokens += int(r.usage.total_tokens or 0)
            text = (r.choices[0].message.content or "") if r.choices else ""
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(".tmp")
            tmp.write_text(json.dumps({"reply": text}))
            tmp.replace(cached)
            return text
        raise LLMError(f"{c.base_url}: {last}", "http")  # not reached
