"""RL math, composed: the losses an update minimizes, over a micro-batch of the trajectories.

`ActorLoss` (`actor_loss`) and `ValueLoss` (`critic_loss`) compose the functions of `stratarl.algo`
(policy losses, aggregation, KL, entropy, rollout correction, the clipped value loss) into the
callables the engine calls on each micro-batch; the engine never learns which algorithm it trains.
"""
