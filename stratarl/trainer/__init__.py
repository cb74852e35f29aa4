"""Layer 2, control flow: in what order does one step happen?

`fit()` and one function per phase (generate, reward, log-prob, values, advantages, update, weight
sync); the SFT loop; validation; when to save and resume (what a run directory holds is `run_directory`).
Talks to workers only through `cluster` handles."""
