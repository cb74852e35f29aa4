"""Layer 5, rewards: rule, model and environment scorers and the reward manager.

Scores sit on the last action token of a response; a scorer that raises or times out yields 0 and
a counted reason, never a dead run."""
