"""Layer 5, agent loops: tools the model can call — the interface, the YAML registry, shipped tools."""
