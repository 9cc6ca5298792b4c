"""Logs and metrics: one structured log line and one metric sample per tool call.

Logs go to stderr (stdout is the wire under stdio), as JSON lines by default. Metrics are in Prometheus'
text format on the HTTP transports' ``/metrics``; they carry tool names and outcomes, never task text,
namespaces or tokens.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from memrl_mcp.memory.service import MemoryService
from memrl_mcp.models import iso_time

CALLS_LOGGER = "memrl_mcp.calls"
log = logging.getLogger(CALLS_LOGGER)
SHOWN_BUCKETS = (100, 250, 500, 1000, 2000, 3000, 4000, 5000, 6000, 8000, 10_000, 20_000, 50_000)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
Status = Literal["ok", "refused", "error", "asking"]  # asking: a 2026-07-28 call that answered InputRequiredResult
_RECORD_FIELDS = set(vars(logging.makeLogRecord({})))
_NOT_LOGGED = {"message", "color_message"}


class Text(logging.Formatter):
    """A log record as one line of text, its time in ISO 8601 (UTC) like the JSON lines'."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return iso_time(record.created)


class JsonLines(logging.Formatter):
    """A log record as one JSON object: time (ISO 8601, UTC), level, logger, message, and any ``extra`` fields but
    uvicorn's ``color_message``: the message again, with terminal colour codes, for its own coloured formatter."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": iso_time(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _RECORD_FIELDS and k not in _NOT_LOGGED})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(log_format: Literal["json", "text"], log_calls: bool = True) -> None:
    """Everything to stderr: under stdio, stdout is the protocol's wire (and an export's output). Without
    ``log_calls`` the per-call lines are dropped (the metrics still count every call)."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonLines())
    else:
        handler.setFormatter(Text())
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    logging.getLogger(CALLS_LOGGER).setLevel(logging.INFO if log_calls else logging.WARNING)


@dataclass
class Call:
    """One tool call as it is logged: how it ended, and who made it (the token's name; None: a local caller)."""

    status: Status = "ok"
    client: str | None = None


class Metrics:
    """The server's metrics, in a registry of its own (several servers may live in one process)."""

    def __init__(self, service: MemoryService) -> None:
        self.registry = CollectorRegistry()
        self._calls = Counter(
            "memrl_tool_calls", "Tool calls by tool and outcome.", ("tool", "status"), registry=self.registry
        )
        self._seconds = Histogram(
            "memrl_tool_call_seconds",
            "Tool call latency, in the server.",
            ("tool",),
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._shown = Histogram(
            "memrl_recall_text_chars",
            "Characters of text one recall or search gives the model (what the plugin's hook adds to a prompt, but "
            "for its two lines).",
            buckets=SHOWN_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_StoreCollector(service))

    def shown(self, chars: int) -> None:
        """Count what one recall or search put into a model's context."""
        self._shown.observe(chars)

    @contextmanager
    def call(self, tool: str) -> Iterator[Call]:
        """Time one tool call; the caller names its client once known, and sets the status to refused when it
        is (an exception otherwise makes it an error)."""
        call = Call()
        start = time.perf_counter()
        try:
            yield call
        except BaseException:
            call.status = "error" if call.status == "ok" else call.status
            raise
        finally:
            seconds = time.perf_counter() - start
            self._calls.labels(tool, call.status).inc()
            self._seconds.labels(tool).observe(seconds)
            log.info(
                "tool call",
                extra={"tool": tool, "status": call.status, "ms": round(seconds * 1000, 3), "client": call.client},
            )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _StoreCollector:
    """Read at scrape time from the service: memories stored and optimistic-write retries."""

    def __init__(self, service: MemoryService) -> None:
        self._service = service

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield GaugeMetricFamily("memrl_memories", "Memories stored, all namespaces.", value=self._service.count())
        yield CounterMetricFamily(
            "memrl_write_conflicts",
            "Optimistic writes that lost a race to a concurrent writer and were retried.",
            value=self._service.write_conflicts,
        )
        rewards = CounterMetricFamily(
            "memrl_rewards",
            "Reports, by what decided their reward (the agent, the user, a kind of check).",
            labels=["source"],
        )
        for source, count in sorted(self._service.rewards.items()):
            rewards.add_metric([source], count)
        yield rewards
        yield CounterMetricFamily(
            "memrl_reports_contradicted",
            "Reports whose agent claimed the outcome that the evidence or the user contradicted.",
            value=self._service.contradicted,
        )
