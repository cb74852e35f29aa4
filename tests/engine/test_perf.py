"""Model FLOP counts by hand, the MFU arithmetic, the cached matmul peak and the memory metrics."""

import pytest
import torch

from stratarl.engine.perf import (
    CPU_PEAK_FLOPS_PER_THREAD,
    ModelFlops,
    default_peak_flops,
    gpu_peak_flops,
    measured_matmul_peak,
    memory_metrics,
    mfu,
)
from tests.engine.tiny_batches import tiny_config


def test_flop_coefficients_from_a_config_by_hand():
    # d=16, 1 block, 2 query heads of e=8, 1 kv head, f=32, V=32:
    # q 16·16 + k,v 2·16·8 + o 16·16 + mlp 3·16·32 = 256 + 256 + 256 + 1536 = 2304
    flops = ModelFlops.from_config(tiny_config(layers=1))
    assert flops.block_params == 2304 and flops.head_params == 16 * 32 and flops.attention_coeff == 4 * 2 * 8
    # two rows of 3 and 5 tokens, 4 scored: 2·2304·8 + 2·512·4 + 64·(9 + 25)
    assert flops.forward_flops([3, 5], scored_tokens=4) == 36864 + 4096 + 2176
    assert flops.train_flops([3, 5], scored_tokens=4) == 3 * (36864 + 4096 + 2176)
    assert ModelFlops.from_config(tiny_config(layers=3), head_outputs=1).head_params == 16


def test_block_params_match_the_model_matmul_weights():
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM(tiny_config(layers=2))
    matmul = sum(p.numel() for n, p in model.model.layers.named_parameters() if n.endswith("proj.weight"))
    assert ModelFlops.from_config(model.config).block_params == matmul


def test_flops_from_the_model_count_its_own_matmuls_gated_or_not():
    from transformers import GPT2Config, GPT2LMHeadModel, Qwen2ForCausalLM

    qwen = Qwen2ForCausalLM(tiny_config(layers=2))
    assert ModelFlops.from_model(qwen, qwen.lm_head) == ModelFlops.from_config(qwen.config)
    # GPT-2, d = 16, 3 blocks, MLP 4d ungated: c_attn 3d² + c_proj d² + c_fc, mlp c_proj 2·d·4d = 12d² a block
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_embd=16, n_layer=3, n_head=2, n_positions=16))
    flops = ModelFlops.from_model(gpt2, gpt2.lm_head)
    assert flops.block_params == 3 * 12 * 16 * 16 and flops.head_params == 16 * 32
    assert flops.attention_coeff == 4 * 3 * 2 * 8


def test_mfu_is_achieved_over_peak():
    assert mfu(flops=6e9, seconds=2.0, peak_flops=6e9) == pytest.approx(0.5)
    assert mfu(flops=1.0, seconds=0.0, peak_flops=1.0) == 0.0


def test_default_cpu_peak_scales_the_reference_table_with_threads():
    assert default_peak_flops(torch.float32, "cpu") == 96e9 * torch.get_num_threads()
    assert (
        default_peak_flops(torch.bfloat16, torch.device("cpu"))
        == CPU_PEAK_FLOPS_PER_THREAD[torch.bfloat16] * torch.get_num_threads()
    )


@pytest.mark.parametrize(
    ("name", "bf16_tflops", "fp32_tflops"),
    [
        ("NVIDIA H200", 989.4, 66.9),
        ("NVIDIA H100 80GB HBM3", 989.4, 66.9),
        ("NVIDIA H100 PCIe", 756.0, 51.2),
        ("NVIDIA H200 NVL", 835.0, 60.0),
        ("NVIDIA A100-SXM4-80GB", 312.0, 19.5),
        ("NVIDIA A100 80GB PCIe", 312.0, 19.5),
        ("NVIDIA L40S", 362.0, 91.6),
        ("NVIDIA L4", 121.0, 30.3),
    ],
)
def test_gpu_peaks_come_from_the_datasheet_table_by_device_name(name, bf16_tflops, fp32_tflops):
    assert gpu_peak_flops(name, torch.bfloat16) == pytest.approx(bf16_tflops * 1e12)
    assert gpu_peak_flops(name, torch.float16) == pytest.approx(bf16_tflops * 1e12)
    assert gpu_peak_flops(name, torch.float32) == pytest.approx(fp32_tflops * 1e12)


def test_a_gpu_outside_the_table_has_no_datasheet_peak():
    assert gpu_peak_flops("Tesla T4", torch.bfloat16) is None  # the default then measures a matmul


def test_matmul_peak_is_measured_once_and_cached():
    first = measured_matmul_peak(torch.float32, "cpu", 64)
    assert first > 0 and measured_matmul_peak(torch.float32, "cpu", 64) == first
    assert measured_matmul_peak.cache_info().hits >= 1


def test_memory_metrics_report_gigabytes():
    metrics = memory_metrics()
    assert set(metrics) == {"perf/max_memory_allocated_gb", "perf/cpu_memory_used_gb"}
    assert 0 < metrics["perf/cpu_memory_used_gb"] < 1024 and metrics["perf/max_memory_allocated_gb"] > 0
