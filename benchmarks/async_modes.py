"""Benchmark: GRPO step throughput of each trainer.mode against sync, on Ray with the split placement.

The quickstart's task and tiny model (untrained: the work per step depends on the shapes), the
quickstart recipe with `cluster.backend=ray`, 2 training workers (half a CPU each) and a rollout
replica on its own CPU (`--plan split`; `colocated` for comparison), batches through the controller
(`--queue-units 0`, the default; N > 0: through the TransferQueue), for each mode in the same run:
sync (the baseline), one_step_off, async (`async_training.*` as given), async with the pinned
schedule (`deterministic`) and with `partial_rollout=continue` (split only). Reported: the mean
step time over steps 2..N (step 1 has nothing to overlap with and pays the warm-up), steps per
second, the ratio to sync (higher is better), and the async/* overlap metrics.

    OMP_NUM_THREADS=1 python benchmarks/async_modes.py --steps 8 --json out.json
    OMP_NUM_THREADS=1 python benchmarks/async_modes.py rollout.max_response_tokens=64  # longer rollouts
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from ray_quickstart import PLANS, RECIPE, task_overrides, train_metrics

MODES = {
    "sync": ["trainer.mode=sync"],
    "one_step_off": ["trainer.mode=one_step_off"],
    "async": ["trainer.mode=async", "async_training.max_staleness=2", "async_training.buffer_batches=2"],
}
MODES["async_deterministic"] = [*MODES["async"], "async_training.deterministic=true"]
MODES["async_continue"] = [*MODES["async"], "async_training.partial_rollout=continue"]
MEANS = ("timing_s/step", "timing_s/gen", "timing_s/update_actor", "async/trainer_idle_s")
MEANS += ("async/rollout_idle_s", "async/overlap_ratio", "async/staleness_mean", "response_length/mean")
MEANS += ("async/partial_rows",)


def run(root: Path, base: list[str], plan: str, mode: str, steps: int, queue_units: int) -> dict[str, float]:
    overrides = [f"cluster.transfer_queue_units={queue_units}", *MODES[mode]]
    train = train_metrics(root / f"{plan}-{mode}", base, plan, overrides, steps)[1:]
    means = {k: sum(m.get(k, 0.0) for m in train) / len(train) for k in MEANS}
    staleness_max = max(m["async/staleness_max"] for m in train)
    return means | {"steps_per_s": 1.0 / means["timing_s/step"], "async/staleness_max": staleness_max}


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--plan", choices=list(PLANS), default="split")
    parser.add_argument(
        "--queue-units", type=int, default=0, help="TransferQueue units (0: batches as DataProto)"
    )
    parser.add_argument("--json", default=None, help="write the numbers to this path")
    parser.add_argument("overrides", nargs="*", help="extra overrides, e.g. rollout.max_response_tokens=64")
    args = parser.parse_args()
    os.environ.pop("RAY_ADDRESS", None)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="srl-bench-async-") as tmp:
        root = Path(tmp)
        base = task_overrides(root, args.overrides)
        for mode in MODES:
            if mode == "async_continue" and args.plan == "colocated":
                continue  # refused: a colocated rank cannot take a push while it generates
            r = results[mode] = run(root, base, args.plan, mode, args.steps, args.queue_units)
            r["speedup_vs_sync"] = results["sync"]["timing_s/step"] / r["timing_s/step"]
            print(
                f"{args.plan} {mode:12s} step {r['timing_s/step']:.3f} s ({r['steps_per_s']:.2f} steps/s, "
                f"×{r['speedup_vs_sync']:.2f} vs sync)  gen {r['timing_s/gen']:.3f} s  update "
                f"{r['timing_s/update_actor']:.3f} s  trainer idle {r['async/trainer_idle_s']:.3f} s  "
                f"rollout idle {r['async/rollout_idle_s']:.3f} s  overlap {r['async/overlap_ratio']:.2f}  "
                f"staleness mean {r['async/staleness_mean']:.2f} max {r['async/staleness_max']:g}  "
                f"partial rows {r['async/partial_rows']:.1f}",
                flush=True,
            )
    if args.json:
        config = {
            "steps": args.steps,
            "plan": args.plan,
            "queue_units": args.queue_units,
            "overrides": args.overrides,
            "recipe": str(RECIPE),
        }
        Path(args.json).write_text(json.dumps({"config": config, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
