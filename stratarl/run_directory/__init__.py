"""Run directory, beside layer 2: a run directory holds one run, written by one process at a time.

What the trainer writes into a run directory and reads back from it: the lock (`lock.py`), the
claim and the lineage (`claim.py`: may this start begin, or continue, the run that lives here?
`run.json`), the settings a resume may change (`resume_rules.py`), the trainer's part of a
checkpoint and where a resume continues (`checkpointing.py`), and a finished run's end products:
final weights, plots, placement.json, summary.json (`run_summary.py`). The trainer decides *when*
each happens; nothing here imports the trainer."""
