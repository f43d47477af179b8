"""plan: will a run fit, how long will it take: the planner, its memory terms, the micro-batch fit, data size.
Pure functions of a `PlanInput` (no torch): may import contract only, never another launcher folder."""
