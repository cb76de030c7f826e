"""Planning metrics through the OpenTelemetry metrics API: plans and steps by outcome, retries,
and checkpoint (state store commit) latency.

The engine and the SQLite store each hold a ``PlanningMetrics``. It depends on the API only; the
process's ``MeterProvider`` (``runtime.setup_telemetry``) decides whether anything is exported. With
no provider set up the instruments are the API's no-ops and cost next to nothing.
"""

from __future__ import annotations

from typing import Final

from opentelemetry import metrics
from opentelemetry.metrics import MeterProvider

__all__ = ["PlanningMetrics"]

METER_NAME: Final = "stratagem.planning"

# Seconds: a SQLite commit takes from tens of microseconds (no fsync) to tens of milliseconds.
_COMMIT_BUCKETS: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)


class PlanningMetrics:
    """The planning layer's instruments.

    Instruments (attribute keys in brackets):

    * ``stratagem.plan.runs`` counter: plan runs that ended, by
      [``gen_ai.agent.name``, ``stratagem.outcome``] (a plan status: ``succeeded``, ``failed``,
      ``cancelled``, ``paused``, ``replanned``).
    * ``stratagem.steps`` counter: steps that settled, by [``gen_ai.agent.name``,
      ``stratagem.outcome``] (``succeeded``, ``failed``, ``skipped``, ``cancelled``).
    * ``stratagem.step.retries`` counter: failed attempts that will be retried, by
      [``gen_ai.agent.name``, ``stratagem.failure.class``].
    * ``stratagem.store.commit.duration`` histogram (seconds): one state store commit (a
      checkpoint of the journal), by [``stratagem.store``].

    Args:
        meter_provider: Where the instruments come from; the global provider by default.
    """

    def __init__(self, meter_provider: MeterProvider | None = None) -> None:
        meter = metrics.get_meter(METER_NAME, meter_provider=meter_provider)
        self._plans = meter.create_counter(
            "stratagem.plan.runs", unit="{run}", description="Plan runs that ended, by outcome"
        )
        self._steps = meter.create_counter(
            "stratagem.steps", unit="{step}", description="Steps that settled, by outcome"
        )
        self._retries = meter.create_counter(
            "stratagem.step.retries",
            unit="{retry}",
            description="Failed step attempts that will be retried",
        )
        self._commit = meter.create_histogram(
            "stratagem.store.commit.duration",
            unit="s",
            description="Duration of one state store commit (a journal checkpoint)",
            explicit_bucket_boundaries_advisory=_COMMIT_BUCKETS,
        )
        # Attribute sets are few (agent x outcome): build each once, not per measurement.
        self._attrs: dict[tuple[str, str, str], dict[str, str]] = {}

    def _attributes(self, key: str, agent: str, value: str) -> dict[str, str]:
        cache_key = (key, agent, value)
        attrs = self._attrs.get(cache_key)
        if attrs is None:
            attrs = self._attrs[cache_key] = {"gen_ai.agent.name": agent, key: value}
        return attrs

    def plan_ended(self, agent: str, outcome: str) -> None:
        """Count one plan run of ``agent`` that ended with ``outcome``."""
        self._plans.add(1, self._attributes("stratagem.outcome", agent, outcome))

    def step_settled(self, agent: str, outcome: str) -> None:
        """Count one step of ``agent`` that settled with ``outcome``."""
        self._steps.add(1, self._attributes("stratagem.outcome", agent, outcome))

    def retried(self, agent: str, failure_class: str) -> None:
        """Count one failed attempt of ``agent`` that will be retried."""
        self._retries.add(1, self._attributes("stratagem.failure.class", agent, failure_class))

    def commit_recorded(self, store: str, seconds: float) -> None:
        """Record one state store commit that took ``seconds``."""
        self._commit.record(seconds, {"stratagem.store": store})
