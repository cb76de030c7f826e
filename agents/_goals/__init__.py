"""Goals in plain words: the capability directory, the router and the deterministic planner.

``AskGoal`` (``protocol._goals``) is planned here: ``CapabilityDirectory`` lists every capability
that declares intents, ``Matcher`` scores a goal's clauses against them (``Bm25``), and
``GoalPlanner`` binds slots and earlier outputs into a typed ``OrchestrationPlan``, replans around
a failed step and summarises the outcome.
"""

from stratagem.agents._goals._bm25 import Bm25, tokens
from stratagem.agents._goals._directory import CapabilityDirectory, DirectoryEntry
from stratagem.agents._goals._match import (
    MATCH_THRESHOLD,
    Clause,
    Match,
    Matcher,
    extract_slots,
    split_clauses,
)
from stratagem.agents._goals._planner import GOAL_REPLANNED, GoalPlanner, show_goal_plan, summary

__all__ = [
    "GOAL_REPLANNED",
    "MATCH_THRESHOLD",
    "Bm25",
    "CapabilityDirectory",
    "Clause",
    "DirectoryEntry",
    "GoalPlanner",
    "Match",
    "Matcher",
    "extract_slots",
    "show_goal_plan",
    "split_clauses",
    "summary",
    "tokens",
]
