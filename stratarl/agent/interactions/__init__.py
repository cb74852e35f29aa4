"""Layer 5, agent loops: interactions — a simulated user or environment that answers the model."""
