"""Benchmark: the TransferQueue against handing DataProto through the controller, in the same run.

One step-sized batch (`--rows` trajectories × `--tokens` response tokens: responses and
response_mask int64, old_log_probs float32). For each backend it reports

- bytes through the controller to move `old_log_probs` from a writer to a reader: the pickled
  metas the controller receives and sends, against the pickled DataProto it would otherwise
  receive and send (verl 0.8's single-controller path);
- put and get throughput of the whole batch, against a baseline of the same bytes: a `clone` of
  the tensors in-process; `ray.put` + `ray.get` of the DataProto through the object store on Ray;
- on Ray, the wall time of one writer→reader hop of `old_log_probs` between two worker actors,
  through the queue versus through the driver.

Times are the best of `--repeats`; ratios are ours / baseline (bytes, time: lower is better).

    OMP_NUM_THREADS=1 python benchmarks/transport.py --rows 256 --tokens 1024 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import tempfile
import time
from collections.abc import Callable

import torch

from stratarl.transport.data_proto import DataProto
from stratarl.transport.kv_meta import KVBatchMeta
from stratarl.transport.transfer_queue import TransferQueue


def make_batch(rows: int, tokens: int) -> DataProto:
    g = torch.Generator().manual_seed(0)
    return DataProto.from_columns(
        {
            "responses": torch.randint(0, 32000, (rows, tokens), generator=g),
            "response_mask": torch.ones(rows, tokens, dtype=torch.int64),
            "old_log_probs": -torch.rand(rows, tokens, generator=g),
            "uid": [f"prompt-{i // 8}" for i in range(rows)],
        }
    )


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` runs: on a shared machine, the run least disturbed by other load."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def payload_mb(batch: DataProto) -> float:
    return sum(t.numel() * t.element_size() for t in batch.batch.values()) / 1e6


def bench_in_process(batch: DataProto, units: int, repeats: int) -> dict[str, float]:
    queue = TransferQueue.in_process(units)
    keys = [f"step-0/{i}" for i in range(len(batch))]
    meta = queue.put(batch, "step-0", keys=keys)
    logp_meta = queue.put(batch.select(["old_log_probs"]), meta=meta.select_fields([]))
    got = queue.get(pickle.loads(pickle.dumps(logp_meta)), ["old_log_probs"])
    assert torch.equal(got["old_log_probs"], batch["old_log_probs"])
    return {
        "controller_bytes": 2 * len(pickle.dumps(logp_meta)),
        "baseline_controller_bytes": 2 * len(pickle.dumps(batch.select(["old_log_probs"]))),
        "put_s": best_seconds(lambda: queue.put(batch, "step-0", keys=keys), repeats),
        "get_s": best_seconds(lambda: queue.get(meta), repeats),
        "baseline_put_s": best_seconds(lambda: {k: v.clone() for k, v in batch.batch.items()}, repeats),
    }


def bench_ray(batch: DataProto, units: int, repeats: int) -> dict[str, float]:
    import ray

    from stratarl.cluster.transfer_queue_ray import ray_transfer_queue

    os.environ.pop("RAY_ADDRESS", None)
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    temp_dir = tempfile.mkdtemp(prefix="srl-bench-", dir="/tmp")
    ray.init(address="local", num_cpus=2, include_dashboard=False, _temp_dir=temp_dir,
             object_store_memory=512 * 1024**2, log_to_driver=False)  # fmt: skip
    try:
        queue = ray_transfer_queue(units)
        Worker = ray.remote(num_cpus=0)(_Worker)
        writer, reader = Worker.remote(queue, batch), Worker.remote(queue, None)
        meta = ray.get(writer.rollout.remote("step-0"))
        ray.get([writer.ping.remote(), reader.ping.remote()])

        def hop_through_queue() -> float:
            out = ray.get(writer.log_prob_to_queue.remote(meta))
            return ray.get(reader.read_from_queue.remote(out))

        def hop_through_driver() -> float:
            data = ray.get(writer.log_prob_to_driver.remote())
            return ray.get(reader.read_data.remote(data))

        assert hop_through_queue() == hop_through_driver()
        logp_meta = ray.get(writer.log_prob_to_queue.remote(meta))
        keys = [f"bench/{i}" for i in range(len(batch))]
        result = {
            "controller_bytes": 2 * len(pickle.dumps(logp_meta)),
            "baseline_controller_bytes": 2 * len(pickle.dumps(ray.get(writer.log_prob_to_driver.remote()))),
            "hop_s": best_seconds(hop_through_queue, repeats),
            "baseline_hop_s": best_seconds(hop_through_driver, repeats),
            "put_s": best_seconds(lambda: queue.put(batch, "bench", keys=keys), repeats),
        }
        bench_meta = queue.put(batch, "bench", keys=keys)
        result["get_s"] = best_seconds(lambda: queue.get(bench_meta), repeats)
        result["baseline_put_s"] = best_seconds(lambda: ray.get(ray.put(batch)), repeats)
        queue.units.shutdown()
        return result
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


class _Worker:
    """Holds a rollout batch; produces old_log_probs into the queue or back to the driver."""

    def __init__(self, queue: TransferQueue, batch: DataProto | None):
        self.queue, self.batch = queue, batch

    def ping(self) -> None:
        return None

    def rollout(self, partition: str) -> KVBatchMeta:
        return self.queue.put(self.batch.select(["responses", "response_mask", "uid"]), partition)

    def log_prob_to_queue(self, meta: KVBatchMeta) -> KVBatchMeta:
        return self.queue.put(self.batch.select(["old_log_probs"]), meta=meta.select_fields([]))

    def log_prob_to_driver(self) -> DataProto:
        return self.batch.select(["old_log_probs"])

    def read_from_queue(self, meta: KVBatchMeta) -> float:
        return self.read_data(self.queue.get(meta, ["old_log_probs"]))

    def read_data(self, data: DataProto) -> float:
        return float(data["old_log_probs"].sum())


def report(config: dict, results: dict[str, dict[str, float]]) -> str:
    mb = config["payload_mb"]
    lines = [
        f"Batch: {config['rows']} rows × {config['tokens']} tokens ({mb:.1f} MB of tensors), "
        f"{config['units']} storage units, best of {config['repeats']}.",
        "",
        "| backend | controller bytes (queue / via controller) | ratio | put MB/s | get MB/s "
        "| baseline MB/s | put ratio | hop ms (queue / via driver) | hop ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        hop = "—", "—"
        if "hop_s" in r:
            hop = (
                f"{r['hop_s'] * 1e3:.1f} / {r['baseline_hop_s'] * 1e3:.1f}",
                f"{r['hop_s'] / r['baseline_hop_s']:.2f}",
            )
        byte_ratio = r["controller_bytes"] / r["baseline_controller_bytes"]
        lines.append(
            f"| {name} | {r['controller_bytes']:,} / {r['baseline_controller_bytes']:,} | {byte_ratio:.4f} "
            f"| {mb / r['put_s']:.0f} | {mb / r['get_s']:.0f} | {mb / r['baseline_put_s']:.0f} "
            f"| {r['put_s'] / r['baseline_put_s']:.2f} | {hop[0]} | {hop[1]} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--units", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray backend")
    parser.add_argument("--json", default=None, help="write the numbers to this path")
    args = parser.parse_args()
    batch = make_batch(args.rows, args.tokens)
    config = {"rows": args.rows, "tokens": args.tokens, "units": args.units, "repeats": args.repeats}
    config["payload_mb"] = payload_mb(batch)
    results = {"in-process": bench_in_process(batch, args.units, args.repeats)}
    if not args.no_ray:
        results["ray"] = bench_ray(batch, args.units, args.repeats)
    print(report(config, results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": config, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
