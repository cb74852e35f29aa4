"""Layer 1, config: what does this run do?

Typed dataclasses per concept (data, model, rollout, actor, critic, algorithm, reward, trainer,
cluster), YAML recipes that hold overrides only, dotted CLI overrides, validation that names the
offending keys, and the batch plan printed at start-up."""
