"""``GET /metrics``: counters and a latency histogram in the Prometheus text format (version 0.0.4).

Kept here without a client library: a few counters under one lock, written out on each scrape.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Mapping

BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, int], int] = defaultdict(int)
        self._bucket_counts: dict[str, list[int]] = defaultdict(lambda: [0] * len(BUCKETS_S))
        self._sum: dict[str, float] = defaultdict(float)
        self._count: dict[str, int] = defaultdict(int)

    def observe(self, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self._requests[(route, status)] += 1
            counts = self._bucket_counts[route]
            for i, bound in enumerate(BUCKETS_S):
                if seconds <= bound:
                    counts[i] += 1
            self._sum[route] += seconds
            self._count[route] += 1

    def text(
        self,
        gauges: Mapping[str, tuple[str, float]],
        labelled: Mapping[str, tuple[str, Mapping]] | None = None,
        labelled_gauges: Mapping[str, tuple[str, str, Mapping]] | None = None,
    ) -> str:
        """The exposition; ``gauges``: name -> (help, value); ``labelled``: counters kept elsewhere, name ->
        (help, {decision: count}) (the gate's verdicts); ``labelled_gauges``: name -> (help, label name,
        {label value: value}) (a session's state)."""
        out = [
            "# HELP cvs_requests_total Requests answered, by route and HTTP status.",
            "# TYPE cvs_requests_total counter",
        ]
        with self._lock:
            for (route, status), n in sorted(self._requests.items()):
                out.append(f'cvs_requests_total{{route="{route}",status="{status}"}} {n}')
            out += [
                "# HELP cvs_request_errors_total Requests answered with a 4xx or 5xx status, by route.",
                "# TYPE cvs_request_errors_total counter",
            ]
            errors: dict[str, int] = defaultdict(int)
            for (route, status), n in self._requests.items():
                if status >= 400:
                    errors[route] += n
            for route, n in sorted(errors.items()):
                out.append(f'cvs_request_errors_total{{route="{route}"}} {n}')
            out += [
                "# HELP cvs_request_seconds Time from a request's arrival to its answer.",
                "# TYPE cvs_request_seconds histogram",
            ]
            for route in sorted(self._count):
                for bound, n in zip(BUCKETS_S, self._bucket_counts[route]):
                    out.append(f'cvs_request_seconds_bucket{{route="{route}",le="{bound}"}} {n}')
                out.append(f'cvs_request_seconds_bucket{{route="{route}",le="+Inf"}} {self._count[route]}')
                out.append(f'cvs_request_seconds_sum{{route="{route}"}} {self._sum[route]:.6f}')
                out.append(f'cvs_request_seconds_count{{route="{route}"}} {self._count[route]}')
        for name, (help_text, value) in gauges.items():
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value:g}"]
        for name, (help_text, counts) in (labelled or {}).items():
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
            out += [f'{name}{{decision="{d}"}} {n}' for d, n in sorted(counts.items())]
        for name, (help_text, key, values) in (labelled_gauges or {}).items():
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
            out += [f'{name}{{{key}="{v}"}} {n:g}' for v, n in values.items()]
        return "\n".join(out) + "\n"
