"""benchmarks/gpu_check.py's parts that run without a GPU: the CPU fallback of its arguments and the
summary it makes of a run's metrics (steady-state means after the first step, rollout tokens/s)."""

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"
spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_falls_back_to_the_cpu_and_refuses_cuda(capsys):
    args = gpu_check.parse_args(["--model", "tiny"])
    assert (args.device, args.model, args.steps) == ("cpu", "tiny", 5)
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--device", "cuda"])
    assert "torch.cuda.is_available() is False" in capsys.readouterr().err


def test_the_summary_leaves_out_the_warm_up_step():
    def step(seconds, gen, length, mfu):
        return {"timing_s/step": seconds, "timing_s/gen": gen, "response_length/mean": length,
                "perf/mfu/actor": mfu, "perf/max_memory_allocated_gb": seconds / 10}  # fmt: skip

    summary = gpu_check.summarise(
        [step(9.0, 5.0, 10, 0.01), step(2.0, 1.0, 20, 0.3), step(4.0, 3.0, 40, 0.1)], 8
    )
    assert summary["steady_steps"] == 2 and summary["first_step"] == {"timing_s/step": 9.0}
    assert summary["mean"]["timing_s/step"] == 3.0 and summary["mean"]["perf/mfu/actor"] == pytest.approx(0.2)
    # 8 trajectories of 20 and of 40 tokens in 1 s + 3 s of generation: 480 / 4
    assert summary["rollout_tokens_per_s"] == 120.0
    assert summary["peak_memory_gb"] == 0.9  # over every step, the first included
