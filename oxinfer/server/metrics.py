"""Prometheus metrics of one app, in its own CollectorRegistry (two apps in one process, as in the
tests, must not share or clash). Every series carries the `model` it is about: a server may serve
several (models.py). Names follow the engine's vocabulary (events.py, SchedulerStats,
runtime/stats.py's StepStats: a field name with Prometheus's unit suffix)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from oxinfer.events import Finished

# Latency buckets from 5 ms (a decode step of a lone request) to 2 min (a long answer under load).
_LATENCY = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0,
            40.0, 80.0, 120.0)
_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512, 1024, 2048, 4096)

# read at scrape time from each loaded engine's stats(): the server keeps no request table of its own
_GAUGES = (("requests_running", "running", "Requests generating now"),
           ("requests_queued", "queued", "Requests waiting for a slot"),
           ("kv_bytes", "kv_bytes", "KV cache memory held by live requests"),
           ("kv_blocks_used", "kv_blocks_used", "KV blocks live requests hold"),
           ("kv_blocks_cached", "kv_blocks_cached", "Full KV blocks kept for later prompts"))
# totals of stats(): counters (the exposition adds _total)
_TOTALS = (("kv_evictions", "kv_evictions", "Kept KV blocks given up for room"),
           ("preemptions", "preemptions_total", "Requests that gave their KV blocks back to be computed again"))


class Metrics:
    def __init__(self):
        self.engines: dict[str, object] = {}  # the loaded models, by served name
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.prompt_tokens = Counter("oxinfer_prompt_tokens", "Prompt tokens processed", ["model"], registry=r)
        self.cached_tokens = Counter("oxinfer_prompt_tokens_cached", "Prompt tokens reused from earlier requests",
                                     ["model"], registry=r)
        self.generation_tokens = Counter("oxinfer_generation_tokens", "Tokens generated", ["model"], registry=r)
        self.finished = Counter("oxinfer_requests_finished", "Requests finished, by reason", ["model", "reason"],
                                registry=r)
        self.ttft = Histogram("oxinfer_time_to_first_token_seconds", "Arrival to first token (queue included)",
                              ["model"], buckets=_LATENCY, registry=r)
        self.itl = Histogram("oxinfer_inter_token_latency_seconds", "Time between two tokens of one request",
                             ["model"], buckets=_LATENCY, registry=r)
        self.e2e = Histogram("oxinfer_e2e_request_latency_seconds", "Request received to last token",
                             ["model"], buckets=_LATENCY, registry=r)
        self.jobs_per_call = Histogram("oxinfer_scheduler_jobs_per_call",
                                       "Matmul jobs per backend call (one submission)", ["model"], buckets=_COUNTS,
                                       registry=r)
        self.embedding_inputs = Counter("oxinfer_embedding_inputs", "Inputs embedded (/v1/embeddings)", ["model"],
                                        registry=r)
        self.responses = Counter("oxinfer_http_responses", "HTTP responses, by status (refusals included: 400, "
                                 "401, 404, 413, 503...)", ["status"], registry=r)
        self.rows_per_call = Histogram("oxinfer_scheduler_rows_per_call",
                                       "Rows of x per backend call (requests stacked)", ["model"], buckets=_COUNTS,
                                       registry=r)
        r.register(_Scraped(self.engines))

    # --- the models -----------------------------------------------------------------------------
    def attach(self, model: str, engine) -> None:
        """A model was loaded: its engine's figures are read at every scrape from now on."""
        self.engines[model] = engine

        def observe(jobs: int, rows: int) -> None:
            self.jobs_per_call.labels(model=model).observe(jobs)
            self.rows_per_call.labels(model=model).observe(rows)

        engine.scheduler.call_observers.append(observe)

    def detach(self, model: str) -> None:
        """A model was unloaded: its engine's figures leave with it (the request counters stay)."""
        self.engines.pop(model, None)

    # --- what the server tells --------------------------------------------------------------------
    def token(self, model: str, gap_s: float | None, prompt_tokens: int = 0) -> None:
        """A token went out; gap_s since the previous token of its request (None for the first, which
        also brings its prompt_tokens: counted once prefilled, so cancelled requests count right)."""
        self.generation_tokens.labels(model=model).inc()
        if gap_s is not None:
            self.itl.labels(model=model).observe(gap_s)
        if prompt_tokens:
            self.prompt_tokens.labels(model=model).inc(prompt_tokens)

    def finished_request(self, model: str, fin: Finished, e2e_s: float) -> None:
        self.finished.labels(model=model, reason=fin.reason).inc()
        self.cached_tokens.labels(model=model).inc(fin.cached_tokens)
        if fin.completion_tokens:
            self.ttft.labels(model=model).observe(fin.ttft_s)
            self.e2e.labels(model=model).observe(e2e_s)

    def embedded(self, model: str, inputs: int, tokens: int) -> None:
        """An embeddings request answered: its inputs, and its tokens among the prompt tokens."""
        self.embedding_inputs.labels(model=model).inc(inputs)
        self.prompt_tokens.labels(model=model).inc(tokens)

    def response(self, status: int) -> None:
        self.responses.labels(status=str(status)).inc()

    def cancelled(self, model: str) -> None:
        self.finished.labels(model=model, reason="cancelled").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Scraped:
    """The loaded engines' own figures, read at scrape time: gauges of their stats(), and their
    scheduler's and executor's totals as counters."""

    def __init__(self, engines: dict[str, object]):
        self.engines = engines

    def describe(self):
        return []

    def collect(self):
        engines = list(self.engines.items())
        stats = {name: e.stats() for name, e in engines}
        for metric, field, help_ in _GAUGES:
            g = GaugeMetricFamily(f"oxinfer_{metric}", help_, labels=["model"])
            for name, s in stats.items():
                g.add_metric([name], getattr(s, field))
            yield g
        for metric, field, help_ in _TOTALS:
            c = CounterMetricFamily(f"oxinfer_{metric}", help_, labels=["model"])
            for name, s in stats.items():
                c.add_metric([name], getattr(s, field))
            yield c
        g = GaugeMetricFamily("oxinfer_kv_cache_usage_ratio", "KV blocks in use over the pool's (vLLM's "
                              "kv_cache_usage_perc, llama.cpp's kv_cache_usage_ratio)", labels=["model"])
        for name, e in engines:
            g.add_metric([name], stats[name].kv_blocks_used / max(1, e.kv_pool.n_blocks))
        yield g
        rows: dict[str, tuple[str, list]] = {}
        for name, e in engines:
            for metric, help_, value in scheduler_rows(e) + step_rows(e):
                rows.setdefault(metric, (help_, []))[1].append((name, value))
        for metric, (help_, values) in rows.items():
            c = CounterMetricFamily(metric, help_, labels=["model"])
            for name, value in values:
                c.add_metric([name], value)
            yield c


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
    return [(step_metric_name(f), f"StepStats.{f} of the executor requests run on", v) for f, v in ex.stats.as_dict().items()]
