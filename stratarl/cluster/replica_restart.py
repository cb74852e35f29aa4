"""Layer 3, orchestration: a rollout replica of the split plan started again in the place of one lost.

`ReplicaRestarter` is the `start` of the rollout layer's `ReplicaRestarts` (rollout.max_replica_restarts):
given the lost replica's handle it

1. kills the lost process (a hung one still holds its bundle), and forgets it;
2. starts a new `RolloutReplica` process the way the lost one was started — the same spec and
   replica id, on the same bundle of the rollout pool (its CPUs and GPUs) — and builds its engine;
3. gives it the weights the other replicas serve: at version 0 the model directory it loaded
   already, else training rank 0 pushes the actor's weights as that version, as a weight sync does
   (a LoRA actor sends its base weights too). The actor's weights are those of the served version
   while a step generates (trainer.mode=sync, which validation asks for);
4. returns its handle once it serves that version.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray

from stratarl.cluster.policy_worker import PolicyWorker
from stratarl.cluster.rank_process import RankProcess
from stratarl.cluster.ranks import Ranks
from stratarl.cluster.ray_cluster import RayDeployment
from stratarl.cluster.ray_ranks import RayRanks
from stratarl.cluster.rollout_replica import RemoteReplica
from stratarl.rollout.weight_sync import WeightSyncError


class ReplicaRestarter:
    """Starts a rollout replica again on its bundle, serving `served_version()`.

    launch(replica id) -> a new replica process on that replica's bundle (not yet built).
    ranks: the policy's training ranks (rank 0 pushes the weights). served_version: the version the
    replicas serve (the last sync's). bucket_bytes: the weight push's bucket size.
    """

    def __init__(
        self,
        launch: Callable[[int], Any],
        deployment: RayDeployment,
        ranks: Ranks,
        served_version: Callable[[], int],
        *,
        bucket_bytes: int,
    ):
        self.launch, self.deployment, self.ranks = launch, deployment, ranks
        self.served_version, self.bucket_bytes = served_version, bucket_bytes

    def __call__(self, lost: RemoteReplica) -> RemoteReplica:
        ray.kill(lost.actor, no_restart=True)
        if lost.actor in self.deployment.actors:
            self.deployment.actors.remove(lost.actor)
        actor = self.launch(lost.replica_id)
        self.deployment.actors.append(actor)  # stopped with the group from now on
        timeout_s = self.deployment.timeout_s
        RayRanks("rollout", [actor], timeout_s=timeout_s).call_processes("init", RankProcess.start)
        replica = RemoteReplica(
            actor, lost.replica_id, timeout_s=lost.timeout_s, calls=lost.calls, on_failure=lost.on_failure
        )
        version = self.served_version()
        if version > 0:  # version 0 is the model directory, which the new engine loaded
            self.ranks.call_all(
                "weight_sync",
                PolicyWorker.push_weights,
                [replica],
                version=version,
                bucket_bytes=self.bucket_bytes,
                fresh=True,
            )
        if replica.weight_version != version:
            raise WeightSyncError(
                f"rollout replica {lost.replica_id} restarted serving version {replica.weight_version}, "
                f"the others serve {version}"
            )
        return replica
