"""Layer 5, data: datasets in verl parquet schema, chat templates, synthetic tasks, tiny models.

Reads prompts, applies the chat template once, drops and counts over-long or malformed rows with
their file and row, and samples them with a seeded, resumable sampler."""
