"""An example domain for goals in plain words: weather, timer and calendar agents.

Three agents of one's own over deterministic local backends (no network), each capability with
intents (``CapabilitySpec.intents``) so the orchestrator can plan goals onto them::

    stratagem up --extensions examples.extensions.assistant
    stratagem ask "check the weather in Seattle and set a timer for 10 minutes"
    stratagem ask "check the weather in Atlantis and set a timer for 10 minutes"   # replanned
    stratagem ask --plan-only "find my next meeting and set a timer for it"

The weather backend knows a few cities; any other fails with class ``logic`` (``no weather for
...``), which is the failing-weather variant: the orchestrator drops the weather step and what
depends on it, and sets the timer anyway. Two more cities stand for the other ways a service
fails, each time it is asked (``OUTAGES``): ``Vostok``'s station is offline (class ``transient``)
and ``Kerguelen``'s does not answer in time (class ``timeout``); their steps are retried, then
dropped the same way. Timers and events are kept in the agent's memory.
"""

from __future__ import annotations

import hashlib
from typing import Any, Final, Literal

from pydantic import Field

from stratagem.agents import define_agent, tool
from stratagem.planning import (
    FailureClass,
    LogicError,
    Plan,
    PlanResult,
    StepError,
    ToolStep,
)
from stratagem.protocol import EXTENSION_FIELD, CapabilitySpec, WireModel

Day = Literal["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]

# --- the backends: deterministic, local -----------------------------------------------------------

WEATHER: Final = {
    "seattle": (52, "partly cloudy"),
    "london": (48, "light rain"),
    "paris": (61, "sunny"),
    "tokyo": (66, "clear"),
    "new york": (57, "windy"),
}
OUTAGES: Final = {
    "vostok": (FailureClass.TRANSIENT, "the weather station is offline"),
    "kerguelen": (FailureClass.TIMEOUT, "the weather station did not answer in time"),
}
NEXT_MEETING: Final = ("design review", "friday", 25)


def _id(prefix: str, *parts: object) -> str:
    """A stable id: the same request names the same timer or event (a retry sets none twice)."""
    text = "|".join(str(p) for p in parts)
    return f"{prefix}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


# --- weather --------------------------------------------------------------------------------------


class GetWeatherRequest(WireModel):
    """The current weather in a city."""

    city: str = Field(min_length=1, max_length=80)


class GetWeatherResponse(WireModel):
    """The temperature (°F), the sky, and a one-line summary."""

    city: str
    temperature_f: int
    conditions: str
    summary: str


GET_WEATHER = CapabilitySpec(
    name="GetWeather",
    role="weather",
    field=EXTENSION_FIELD,
    request=GetWeatherRequest,
    response=GetWeatherResponse,
    intents=(
        "check the weather in {city}",
        "weather in {city}",
        "what is the weather like in {city}",
        "forecast for {city}",
        "is it raining in {city}",
    ),
)


@tool
async def current_weather(city: str) -> GetWeatherResponse:
    """The weather in ``city`` from the local table; an unknown city fails (class logic), a city
    of ``OUTAGES`` with its class."""
    outage = OUTAGES.get(city.strip().lower())
    if outage is not None:
        failure_class, why = outage
        raise StepError(f"no weather for {city!r}: {why}", failure_class)
    known = WEATHER.get(city.strip().lower())
    if known is None:
        raise LogicError(f"no weather for {city!r}: the weather service does not know it")
    temperature, conditions = known
    return GetWeatherResponse(
        city=city,
        temperature_f=temperature,
        conditions=conditions,
        summary=f"{city}: {temperature}°F, {conditions}",
    )


# --- timer ----------------------------------------------------------------------------------------


class SetTimerRequest(WireModel):
    """A timer of a whole number of minutes."""

    minutes: int = Field(ge=1, le=1440)
    label: str = Field(default="", max_length=80)


class SetTimerResponse(WireModel):
    """The timer set."""

    timer_id: str
    minutes: int
    summary: str


SET_TIMER = CapabilitySpec(
    name="SetTimer",
    role="timer",
    field=EXTENSION_FIELD,
    request=SetTimerRequest,
    response=SetTimerResponse,
    intents=(
        "set a timer for {minutes} minutes",
        "start a {minutes} minute timer",
        "remind me in {minutes} minutes",
        "set a timer for it",
    ),
    side_effects=True,
)


@tool
async def set_timer(minutes: int, label: str = "") -> SetTimerResponse:
    """Set a timer (kept in the agent's memory)."""
    timer_id = _id("timer", minutes, label)
    return SetTimerResponse(
        timer_id=timer_id,
        minutes=minutes,
        summary=f"timer {timer_id} set for {minutes} minutes",
    )


# --- calendar -------------------------------------------------------------------------------------


class AddEventRequest(WireModel):
    """An event on a day of the week."""

    title: str = Field(min_length=1, max_length=120)
    day: Day


class AddEventResponse(WireModel):
    """The event added."""

    event_id: str
    title: str
    day: Day
    summary: str


class NextMeetingRequest(WireModel):
    """The next meeting on the calendar."""


class NextMeetingResponse(WireModel):
    """The next meeting, its day, and how many minutes until it starts."""

    title: str
    day: Day
    minutes: int
    summary: str


ADD_EVENT = CapabilitySpec(
    name="AddEvent",
    role="calendar",
    field=EXTENSION_FIELD,
    request=AddEventRequest,
    response=AddEventResponse,
    intents=(
        "add {title} to my calendar on {day}",
        "schedule {title} on {day}",
        "put {title} in the calendar for {day}",
    ),
    side_effects=True,
)
NEXT_MEETING_SPEC = CapabilitySpec(
    name="NextMeeting",
    role="calendar",
    field=EXTENSION_FIELD,
    request=NextMeetingRequest,
    response=NextMeetingResponse,
    intents=("find my next meeting", "what is my next meeting", "when is my next meeting"),
)


@tool
async def add_event(title: str, day: Day) -> AddEventResponse:
    """Add an event to the calendar."""
    event_id = _id("event", title, day)
    return AddEventResponse(
        event_id=event_id, title=title, day=day, summary=f"{title!r} added on {day} ({event_id})"
    )


@tool
async def next_meeting() -> NextMeetingResponse:
    """The next meeting (the calendar's fixed one)."""
    title, day, minutes = NEXT_MEETING
    return NextMeetingResponse(
        title=title, day=day, minutes=minutes, summary=f"{title} on {day}, in {minutes} minutes"
    )


# --- plans and planners: one tool step per request ------------------------------------------------


class WeatherPlan(Plan):
    """The weather agent's plan."""


class TimerPlan(Plan):
    """The timer agent's plan."""


class CalendarPlan(Plan):
    """The calendar agent's plan."""


class _OneStep:
    """Plans a capability as one call of its tool; answers with the tool's output."""

    role: str = ""
    plan_type: type[Plan] = Plan
    tools: dict[str, str] = {}
    specs: dict[str, CapabilitySpec] = {}

    def plan(self, capability: str, request: WireModel, *, plan_id: str) -> Plan:
        """One tool step with the request's fields as its input."""
        if capability not in self.tools:
            raise ValueError(f"the {self.role} agent cannot plan {capability!r}")
        return self.plan_type(
            id=plan_id,
            owner=self.role,
            goal=capability,
            steps=[ToolStep(id="call", tool=self.tools[capability], input=request.model_dump())],
        )

    def respond(self, capability: str, request: WireModel, result: PlanResult[Any]) -> WireModel:
        """The tool's output as the capability's response."""
        return self.specs[capability].response.model_validate(result.outputs["call"])


class WeatherPlanner(_OneStep):
    """Plans ``GetWeather``."""

    role, plan_type = "weather", WeatherPlan
    tools = {"GetWeather": "current_weather"}
    specs = {"GetWeather": GET_WEATHER}


class TimerPlanner(_OneStep):
    """Plans ``SetTimer``."""

    role, plan_type = "timer", TimerPlan
    tools = {"SetTimer": "set_timer"}
    specs = {"SetTimer": SET_TIMER}


class CalendarPlanner(_OneStep):
    """Plans ``AddEvent`` and ``NextMeeting``."""

    role, plan_type = "calendar", CalendarPlan
    tools = {"AddEvent": "add_event", "NextMeeting": "next_meeting"}
    specs = {"AddEvent": ADD_EVENT, "NextMeeting": NEXT_MEETING_SPEC}


# --- the agents: the orchestrator may call each one -----------------------------------------------

WEATHER_AGENT = define_agent(
    "weather",
    plan_type=WeatherPlan,
    planner=WeatherPlanner,
    tools=[current_weather],
    capabilities=[GET_WEATHER],
    callers={"orchestrator": ["GetWeather", "Describe"]},
    description="The weather in a few cities (a local table).",
)
TIMER_AGENT = define_agent(
    "timer",
    plan_type=TimerPlan,
    planner=TimerPlanner,
    tools=[set_timer],
    capabilities=[SET_TIMER],
    callers={"orchestrator": ["SetTimer", "Describe"]},
    description="Timers of whole minutes.",
)
CALENDAR_AGENT = define_agent(
    "calendar",
    plan_type=CalendarPlan,
    planner=CalendarPlanner,
    tools=[add_event, next_meeting],
    capabilities=[ADD_EVENT, NEXT_MEETING_SPEC],
    callers={"orchestrator": ["AddEvent", "NextMeeting", "Describe"]},
    description="A week's calendar: add events, find the next meeting.",
)
