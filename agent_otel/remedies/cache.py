"""A result cache for tools whose answer depends only on their arguments.

Usage::

    @agent_otel.tool(cache=True)                     # 300 s, 1024 entries
    def exchange_rate(currency: str) -> float: ...

    @agent_otel.tool(cache=agent_otel.ResultCache(ttl=30, max_entries=10_000))
    def geocode(address: str) -> tuple[float, float]: ...

Only successful results are kept (never errors, timeouts or fallbacks). A hit
still produces the tool's span, with ``agent.tool.cache.hit=true`` and the
few microseconds the lookup took as its exec time. The store is pluggable:
anything with ``get`` and ``put`` as in ``CacheStore``, e.g. a shared Redis
client behind a small adapter.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Callable, Hashable, Optional, Protocol

from agent_otel.support import forks
from agent_otel.errors import ConfigError

logger = logging.getLogger("agent_otel")

MISS = object()  # what a store's get() returns when it holds nothing fresh for a key


class CacheStore(Protocol):
    def get(self, key: Hashable) -> object:
        """The value stored under ``key``, or ``MISS`` if absent or expired."""

    def put(self, key: Hashable, value: object, ttl_s: float) -> int:
        """Store ``value`` for ``ttl_s`` seconds; return how many entries were evicted to make room."""


class MemoryStore:
    """In-process, least recently used first out, entries expire after their TTL."""

    def __init__(self, max_entries: int = 1024):
        self.max_entries = max_entries
        self._entries: OrderedDict[Hashable, tuple[float, object]] = OrderedDict()
        self._lock = threading.Lock()
        forks.after_fork_in_child(self.reinit_after_fork)

    def reinit_after_fork(self) -> None:
        self._lock = threading.Lock()  # the entries stay: a fork-inherited cache is still right

    def get(self, key: Hashable) -> object:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return MISS
            expires, value = entry
            if expires <= time.monotonic():
                del self._entries[key]
                return MISS
            self._entries.move_to_end(key)
            return value

    def put(self, key: Hashable, value: object, ttl_s: float) -> int:
        evicted = 0
        with self._lock:
            self._entries[key] = (time.monotonic() + ttl_s, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
                evicted += 1
        return evicted

    def __len__(self) -> int:
        return len(self._entries)


class ResultCache:
    """Which results to keep, for how long, and where.

    ``key`` turns a call's ``(args, kwargs)`` into a hashable key; by default
    the arguments themselves, and a call with an unhashable argument (a list,
    a dict) simply bypasses the cache.
    """

    def __init__(
        self,
        ttl: float = 300.0,
        max_entries: int = 1024,
        store: Optional[CacheStore] = None,
        key: Optional[Callable[[tuple, dict], Hashable]] = None,
    ):
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or ttl <= 0:
            raise ConfigError("ResultCache ttl", ttl, "a number of seconds > 0")
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ConfigError("ResultCache max_entries", max_entries, "a whole number >= 1")
        if key is not None and not callable(key):
            raise ConfigError("ResultCache key", key, "a callable (args, kwargs) -> hashable key")
        self.ttl = float(ttl)
        self.store = store if store is not None else MemoryStore(max_entries)
        self._key = key
        self._failure_logged = False

    def key_for(self, tool: str, args: tuple, kwargs: dict) -> Optional[Hashable]:
        """The key of one call, or None when its arguments cannot be a key."""
        try:
            own = self._key(args, kwargs) if self._key is not None else (args, tuple(sorted(kwargs.items())))
            key = (tool, own)  # one cache may serve several tools
            hash(key)
        except TypeError:
            return None
        return key

    def store_failed(self, operation: str, tool: str, exc: Exception) -> None:
        """A store that raises turns into misses; say so once, not on every call."""
        if not self._failure_logged:
            self._failure_logged = True
            logger.warning(
                "agent-otel: cache store %s failed for tool %r (%s: %s); calls run uncached while it fails",
                operation,
                tool,
                type(exc).__name__,
                exc,
            )
