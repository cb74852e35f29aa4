"""Layer 5, agent loops: single-turn and multi-turn sessions with tools and interactions.

Token-in/token-out: assistant tokens are exactly the sampled ids, observations are templated once
and masked out of `response_mask`."""
