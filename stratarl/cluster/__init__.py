"""Layer 3, orchestration: which processes run what?

Resource pools, placement plans, worker groups (in-process and Ray), dispatch of a batch over
data-parallel ranks, roles and colocation. The only layer that imports `ray`."""
