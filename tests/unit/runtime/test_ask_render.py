"""``stratagem ask`` shows its steps as a table on a wide terminal and a block per step on a narrow
one: at 80 columns the seven-column table broke names mid-word (``get_weathe`` / ``r``)."""

from __future__ import annotations

import json

from rich.console import Console

from stratagem.protocol import AskGoalResponse, GoalStep
from stratagem.runtime.operator._ask import WIDE, steps_blocks, steps_table

ANSWER = AskGoalResponse(
    plan_id="ask-220dfb64b6ee",
    status="succeeded",
    route="plan",
    steps=[
        GoalStep(
            id="get_weather",
            agent="weather",
            capability="GetWeather",
            request_json=json.dumps({"city": "Seattle"}),
            why="'check the weather in Seattle' matched 'check the weather in {city}'",
            score=1.0,
            status="succeeded",
        ),
        GoalStep(
            id="set_timer",
            agent="timer",
            capability="SetTimer",
            request_json=json.dumps({"minutes": {"$ref": "next_meeting.minutes"}}),
            depends_on=["next_meeting"],
            why="'set a timer for it' matched 'set a timer for it'",
            score=0.5,
            side_effects=True,
            status="failed",
        ),
    ],
)


def _shown(renderable: object, width: int) -> list[str]:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text().splitlines()


def test_a_narrow_terminal_gets_a_block_per_step_with_every_name_whole() -> None:
    lines = _shown(steps_blocks(ANSWER), 80)
    assert max(map(len, lines)) <= 80
    assert lines[0] == "plan ask-220dfb64b6ee (plan)"
    assert lines[1] == "get_weather  weather.GetWeather  succeeded · score 1.00"
    assert lines[2] == "  inputs city=Seattle"
    assert lines[3] == (
        "  why    'check the weather in Seattle' matched 'check the weather in {city}'"
    )
    assert lines[4] == "set_timer  timer.SetTimer (side effects)  failed · score 0.50"
    assert lines[5:] == [
        "  inputs minutes=next_meeting.minutes",
        "  after  next_meeting",
        "  why    'set a timer for it' matched 'set a timer for it'",
    ]


def test_a_wide_terminal_keeps_the_table() -> None:
    lines = _shown(steps_table(ANSWER), WIDE)
    header = next(line for line in lines if "agent.capability" in line)
    assert all(word in header for word in ("step", "inputs", "after", "why", "score", "status"))
    assert any("get_weather" in line and "weather.GetWeather" in line for line in lines)
