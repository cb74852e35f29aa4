"""Benchmark: bytes through the controller per GRPO step on Ray, TransferQueue against DataProto.

The quickstart's task and tiny model (untrained: the bytes depend on the shapes, not the skill),
`--steps` GRPO steps of the quickstart recipe with `cluster.backend=ray` and 2 training workers,
for each placement plan (colocated; split with a rollout replica) and each data path:
`cluster.transfer_queue_units=2` (rows go through the queue, the controller passes references)
against `cluster.transfer_queue_units=0` (batches travel through the controller as DataProto, the
baseline), measured in the same run. Reported per step (mean over the steps): the controller's
sent and received bytes (`controller/sent_bytes|received_bytes`: rank calls, engine requests and
results, and the controller's own queue reads and writes), the step time, and the ratio
queue / DataProto (lower is better for bytes).

    OMP_NUM_THREADS=1 python benchmarks/controller_bytes.py --steps 3 --json out.json
    OMP_NUM_THREADS=1 python benchmarks/controller_bytes.py rollout.max_response_tokens=128  # longer rows
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from ray_quickstart import PLANS, RECIPE, task_overrides, train_metrics

RATIO_KEYS = ("controller/sent_bytes", "controller/received_bytes", "timing_s/step")
PATHS = {"queue": "cluster.transfer_queue_units=2", "dataproto": "cluster.transfer_queue_units=0"}


def run(root: Path, base: list[str], plan: str, path: str, steps: int) -> dict[str, float]:
    train = train_metrics(root / f"{plan}-{path}", base, plan, [PATHS[path]], steps)
    keys = ("controller/sent_bytes", "controller/received_bytes", "timing_s/step", "response_length/mean")
    return {k: sum(m[k] for m in train) / len(train) for k in keys}


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the numbers to this path")
    parser.add_argument("overrides", nargs="*", help="extra overrides, e.g. rollout.max_response_tokens=128")
    args = parser.parse_args()
    os.environ.pop("RAY_ADDRESS", None)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="srl-bench-bytes-") as tmp:
        root = Path(tmp)
        base = task_overrides(root, args.overrides)
        for plan in PLANS:
            for path in PATHS:
                results[f"{plan}/{path}"] = run(root, base, plan, path, args.steps)
                r = results[f"{plan}/{path}"]
                print(
                    f"{plan:9s} {path:9s} sent {r['controller/sent_bytes'] / 1e3:8.1f} KB/step  "
                    f"received {r['controller/received_bytes'] / 1e3:8.1f} KB/step  "
                    f"step {r['timing_s/step']:.2f} s  "
                    f"(mean response {r['response_length/mean']:.1f} tokens)",
                    flush=True,
                )
            q, d = results[f"{plan}/queue"], results[f"{plan}/dataproto"]
            ratio = results[f"{plan}/ratio"] = {k: q[k] / d[k] for k in RATIO_KEYS}
            print(
                f"{plan:9s} queue/DataProto: sent ×{ratio['controller/sent_bytes']:.3f}  "
                f"received ×{ratio['controller/received_bytes']:.3f}  "
                f"step time ×{ratio['timing_s/step']:.2f}",
                flush=True,
            )
    if args.json:
        config = {"steps": args.steps, "overrides": args.overrides, "recipe": str(RECIPE)}
        Path(args.json).write_text(json.dumps({"config": config, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
