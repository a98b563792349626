"""Planning: the knob catalog (``knobs``), cases from one baseline plus interventions
(``planner``), and operator binding into an ExecutionPlan with its canonical rows (``binding``)."""
