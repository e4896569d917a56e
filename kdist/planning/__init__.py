"""The mesh planner: `plan`, its `Plan` and `Candidate`s, and `preset` (which takes "auto")."""

from kdist.planning.auto import preset
from kdist.planning.plan import Candidate, Plan
from kdist.planning.planner import DEFAULT_BANDWIDTH, DEFAULT_LATENCY, plan

__all__ = ["Candidate", "DEFAULT_BANDWIDTH", "DEFAULT_LATENCY", "Plan", "plan", "preset"]
