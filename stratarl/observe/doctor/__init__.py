"""Cross-cutting: `stratarl doctor RUN` — read a run's own records, say what is wrong and in which layer.

`diagnosis` runs the checks in order and prints the findings; `view` loads a run directory (its
metrics, trace, config, hang reports, lock) into one `RunView`. The checks, by what they look at:
`checks` (reward, parsing, truncation, group signal, policy movement, entropy), `collapse` (an
update that breaks the policy), `learning` (flat validation, the KL term's size), `distillation`
(a teacher that disagrees with the reward), `reward` (a reward of the wrong sign or meaning,
hacking by length or a shortcut, a saturated format reward), `sampling` (sampling too cold, EOS,
dropped prompts), `system` (hangs, numerics, staleness, the rollout/trainer log-prob mismatch),
`resources` (memory, time), `run_state` (whether the run lives, and what a restart may do).
"""
