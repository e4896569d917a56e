"""The sharding inspector: `inspect` (where each variable lives, bytes per device) and `grid_view`."""

from kdist.inspection.grid import GridView, grid_view
from kdist.inspection.inspector import inspect, planned_optimizer
from kdist.inspection.report import ShardingReport, VariableReport

__all__ = ["GridView", "ShardingReport", "VariableReport", "grid_view", "inspect", "planned_optimizer"]
