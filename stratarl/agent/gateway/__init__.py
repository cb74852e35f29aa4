"""Layer 5, agent gateway: an OpenAI-compatible endpoint over the rollout engine, so that any agent
program — its own control flow, any OpenAI client — is trained unchanged, on the token ids the
model really sampled (docs/agent_gateway.md)."""
