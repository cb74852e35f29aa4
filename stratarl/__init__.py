"""stratarl: readable, layered RL post-training for LLMs."""
