"""Applications, above the layers: ready-made jobs composed from any layer, as the CLI is.

The quickstart (`quickstart.py`: an arithmetic task and a tiny model, SFT then GRPO, measured on
held-out problems), the tool quickstart (`tool_quickstart.py`: the same with a calculator tool in
the rollout) and `stratarl init` (`task_init.py`: a tiny model and a sized recipe from any
verl-schema parquet). They may import every layer; no layer imports them (the CLI does)."""
