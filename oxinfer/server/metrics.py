"""Prometheus metrics of one app, in its own CollectorRegistry (two apps in one process, as in the
tests, must not share or clash). Names follow the engine's vocabulary (events.py, SchedulerStats, runtime/stats.py's StepStats: a field
name with Prometheus's unit suffix)."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily

from oxinfer.events import Finished

# Latency buckets from 5 ms (a decode step of a lone request) to 2 min (a long answer under load).
_LATENCY = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0,
            40.0, 80.0, 120.0)
_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512, 1024, 2048, 4096)


class Metrics:
    def __init__(self, engine):
        self.engine = engine
        self.registry = r = CollectorRegistry(auto_describe=True)
        # read at scrape time from the engine: the server keeps no request table of its own
        Gauge("oxinfer_requests_running", "Requests generating now", registry=r).set_function(
            lambda: engine.stats().running)
        Gauge("oxinfer_requests_queued", "Requests waiting for a slot", registry=r).set_function(
            lambda: engine.stats().queued)
        Gauge("oxinfer_kv_bytes", "KV cache memory held by live requests", registry=r).set_function(
            lambda: engine.stats().kv_bytes)
        for name, help_ in (("kv_blocks_used", "KV blocks live requests hold"),
                            ("kv_blocks_cached", "Full KV blocks kept for later prompts"),
                            ("kv_evictions", "Kept KV blocks given up for room (total)"),
                            ("preemptions_total", "Requests that gave their KV blocks back to be computed again")):
            Gauge(f"oxinfer_{name}", help_, registry=r).set_function(lambda n=name: getattr(engine.stats(), n))
        self.prompt_tokens = Counter("oxinfer_prompt_tokens", "Prompt tokens processed", registry=r)
        self.cached_tokens = Counter("oxinfer_prompt_tokens_cached", "Prompt tokens reused from earlier requests",
                                     registry=r)
        self.generation_tokens = Counter("oxinfer_generation_tokens", "Tokens generated", registry=r)
        self.finished = Counter("oxinfer_requests_finished", "Requests finished, by reason", ["reason"], registry=r)
        self.ttft = Histogram("oxinfer_time_to_first_token_seconds", "Arrival to first token (queue included)",
                              buckets=_LATENCY, registry=r)
        self.itl = Histogram("oxinfer_inter_token_latency_seconds", "Time between two tokens of one request",
                             buckets=_LATENCY, registry=r)
        self.e2e = Histogram("oxinfer_e2e_request_latency_seconds", "Request received to last token",
                             buckets=_LATENCY, registry=r)
        self.jobs_per_call = Histogram("oxinfer_scheduler_jobs_per_call",
                                       "Matmul jobs per backend call (one submission)", buckets=_COUNTS, registry=r)
        self.rows_per_call = Histogram("oxinfer_scheduler_rows_per_call",
                                       "Rows of x per backend call (requests stacked)", buckets=_COUNTS, registry=r)
        engine.scheduler.call_observers.append(self._observe_call)
        r.register(_Counters(lambda: scheduler_rows(engine)))
        r.register(_Counters(lambda: step_rows(engine)))

    def _observe_call(self, jobs: int, rows: int) -> None:
        self.jobs_per_call.observe(jobs)
        self.rows_per_call.observe(rows)

    def token(self, gap_s: float | None, prompt_tokens: int = 0) -> None:
        """A token went out; gap_s since the previous token of its request (None for the first, which
        also brings its prompt_tokens: counted once prefilled, so cancelled requests count right)."""
        self.generation_tokens.inc()
        if gap_s is not None:
            self.itl.observe(gap_s)
        if prompt_tokens:
            self.prompt_tokens.inc(prompt_tokens)

    def finished_request(self, fin: Finished, e2e_s: float) -> None:
        self.finished.labels(reason=fin.reason).inc()
        self.cached_tokens.inc(fin.cached_tokens)
        if fin.completion_tokens:
            self.ttft.observe(fin.ttft_s)
            self.e2e.observe(e2e_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Counters:
    """Totals read at scrape time, as counters: rows() gives (name, help, value) for each."""

    def __init__(self, rows):
        self.rows = rows

    def describe(self):
        return []

    def collect(self):
        for name, help_, value in self.rows():
            yield CounterMetricFamily(name, help_, value=value)


def scheduler_rows(engine):
    """The scheduler's own totals (SchedulerStats)."""
    c = engine.scheduler.counters
    return [(f"oxinfer_scheduler_{name}", help_, value) for name, help_, value in (
        ("calls", "Backend matmul calls", c.calls),
        ("jobs", "Matmul products computed", c.jobs),
        ("rows", "Rows of x over all calls", c.rows),
        ("submissions", "linear() awaits served", c.submissions),
        ("solo_forwards", "Forwards run whole in a worker thread", c.solo_forwards),
        ("gpu_calls", "Calls run on the GPU", c.gpu_calls),
        ("fallbacks", "GPU calls rerun on the CPU", c.fallbacks))]


def step_metric_name(field: str) -> str:
    """A StepStats field as a metric name: `wait_s` -> `oxinfer_step_wait_seconds` (a counter's
    `_total` is added by the exposition)."""
    return "oxinfer_steps" if field == "steps" else f"oxinfer_step_{field[:-2] + '_seconds' if field.endswith('_s') else field}"


def step_rows(engine):
    """The step totals of the executor requests run on (its StepStats)."""
    ex = engine.executor
    return [(step_metric_name(f), f"StepStats.{f} of the {ex.name} executor", v) for f, v in ex.stats.as_dict().items()]
