"""Generation through several replicas into the TransferQueue: one batch edge, whatever each replica sent."""

import numpy as np
import torch

from stratarl.cluster.queue_rows import QueueRows
from stratarl.cluster.queue_shard import generate_into_queue
from stratarl.cluster.rollout_set import RolloutReplicas
from stratarl.rollout.interface import SamplingParams
from stratarl.rollout.torch_engine import TorchRolloutEngine
from stratarl.transport.data_proto import DataProto
from stratarl.transport.transfer_queue import TransferQueue
from tests.rollout.tiny_lm import EOS, PAD, build_tiny_qwen2


class ServingProcess:
    """What a `RemoteReplica` reaches on a rollout process, called in this process: the engine's
    own `generate_into_queue` narrows the columns it sends by the values of its own share."""

    def __init__(self, engine: TorchRolloutEngine):
        self.rollout = engine
        self.replica_id = engine.replica_id

    @property
    def weight_version(self) -> int:
        return self.rollout.weight_version

    def generate_into_queue(self, requests, queue, meta, **layout) -> DataProto:
        return generate_into_queue(self.rollout, requests, queue, meta, **layout)


def test_replicas_whose_value_ranges_differ_give_one_batch_in_the_engine_dtypes():
    model = build_tiny_qwen2(seed=0)
    engines = [
        TorchRolloutEngine(build_tiny_qwen2(seed=0), eos_token_ids=EOS, pad_token_id=PAD, replica_id=i)
        for i in range(2)
    ]
    # Replica 1 serves version 2: its token_weight_version holds 0 (padding) and 2, sent as int32;
    # replica 0's holds only 0 and 1, sent as bool. The same column crosses the wire in two dtypes.
    engines[0].load_weights(model.state_dict(), version=1)
    engines[1].load_weights(model.state_dict(), version=2)
    replicas = RolloutReplicas([ServingProcess(e) for e in engines], pad_token_id=PAD)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
    batch = DataProto.from_dict(non_tensors={"raw_prompt_ids": np.array(prompts, dtype=object)})
    rows = QueueRows(TransferQueue.in_process(2))

    out = replicas.generate_queued(batch, SamplingParams(temperature=1.0, max_tokens=6), rows, seed=0)

    assert sorted(set(out.non_tensor_batch["replica_id"].tolist())) == [0, 1]
    assert out["token_weight_version"].dtype == torch.int64 and out["responses"].dtype == torch.int64
    for row, replica in enumerate(out.non_tensor_batch["replica_id"]):
        versions = out["token_weight_version"][row][out["response_mask"][row].bool()]
        assert versions.tolist() == [int(replica) + 1] * len(versions), row
