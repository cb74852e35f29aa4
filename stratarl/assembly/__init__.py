"""Assembly: what a run's config builds, before the first step.

The trainer's inputs from `RunConfig`, built once: the tokenizer and the prompt datasets
(`datasets`), the trained roles' specs and worker groups with their Ray placement (`roles`), the
algorithm's losses and settings (`algorithm`), the reward (`scoring`), the watchdog and the worker
processes it watches (`run_watch`), and the input checks that need more than the config
(`preflight`). Config stops here: what this package hands down is typed specs, plain values and
built objects.
"""
