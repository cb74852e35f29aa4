"""Layer 2, control flow: in what order does one step happen?

`fit()` and one function per phase (generate, reward, log-prob, values, advantages, update, weight
sync); the SFT loop; validation; checkpoint and resume. Talks to workers only through `cluster`
handles."""
