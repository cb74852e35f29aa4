"""Layer 6, RL math: how rewards become an objective.

Pure torch functions that read like the papers: advantage estimators, policy losses, loss
aggregation, KL estimators and controllers, value loss, entropy, rollout correction, validation
statistics. No config objects, no Ray, no torch.distributed; cross-rank totals arrive as arguments.
Variants are selected from plain dicts (name -> function)."""
