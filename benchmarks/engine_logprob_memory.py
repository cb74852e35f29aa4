"""Peak memory of log-prob + entropy at V = 32k, T = 1k: chunked head vs materialized [K, V] logits.

Each variant runs in a fresh subprocess. After its inputs exist the process resets its resident-set
high-water mark (Linux: write 5 to /proc/self/clear_refs), runs the computation, and reports
VmHWM − VmRSS: the extra peak memory of that computation alone. Variants, for K = N·T scored tokens
with hidden states h [K, d] and an output head W [V, d], fp32:

  naive           logits [K, V] at once, log_softmax/softmax through autograd (the plain form)
  logits+chunked  logits [K, V] at once, then algo.entropy's chunked log-prob/entropy (saves no softmax)
  fused           engine.fused_head.head_scores: logits made `chunk` rows at a time, never [K, V]

    OMP_NUM_THREADS=1 python benchmarks/engine_logprob_memory.py [--rows 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

MIB = 1024 * 1024


def _status_kib(key: str) -> int:
    return int(re.search(rf"{key}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def run_variant(
    variant: str, rows: int, seq: int, vocab: int, hidden: int, chunk: int, backward: bool
) -> dict:
    import torch

    from stratarl.algo.entropy import entropy_from_logits_chunked, log_prob_from_logits_chunked
    from stratarl.engine.fused_head import head_scores, head_scores_naive

    torch.manual_seed(0)
    k = rows * seq
    h = torch.randn(k, hidden).requires_grad_(backward)
    w = (torch.randn(vocab, hidden) * hidden**-0.5).requires_grad_(backward)
    labels = torch.randint(0, vocab, (k,))
    Path("/proc/self/clear_refs").write_text("5")
    base = _status_kib("VmRSS")
    start = time.perf_counter()
    with torch.set_grad_enabled(backward):
        if variant == "naive":
            lp, ent = head_scores_naive(h, w, None, labels, with_entropy=True)
        elif variant == "logits+chunked":
            logits = h @ w.T
            lp = log_prob_from_logits_chunked(logits, labels, chunk)
            ent = entropy_from_logits_chunked(logits, chunk)
        else:
            lp, ent = head_scores(h, w, None, labels, chunk_size=chunk, with_entropy=True)
        if backward:
            (lp.sum() + ent.sum()).backward()
    seconds = time.perf_counter() - start
    return {"extra_peak_mib": (_status_kib("VmHWM") - base) / 1024, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2, help="N sequences (kept small for a 24 GiB machine)")
    parser.add_argument("--seq", type=int, default=1024, help="T scored tokens per sequence")
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--chunks", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", nargs=3, metavar=("VARIANT", "CHUNK", "BACKWARD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = (args.rows, args.seq, args.vocab, args.hidden)
    if args.worker:
        variant, chunk, backward = args.worker
        print(json.dumps(run_variant(variant, *shape, int(chunk), backward == "1")))
        return
    variants = [("naive", 0), ("logits+chunked", args.chunks[0])] + [("fused", c) for c in args.chunks]
    results = []
    kv_mib = args.rows * args.seq * args.vocab * 4 / MIB
    print(f"N={args.rows} T={args.seq} V={args.vocab} d={args.hidden}: [K, V] fp32 = {kv_mib:.0f} MiB")
    print(
        f"{'variant':>16} {'chunk':>6} {'fwd MiB':>9} {'fwd+bwd MiB':>12} {'fwd+bwd s':>10} {'vs naive':>9}"
    )
    for variant, chunk in variants:
        row = {"variant": variant, "chunk": chunk}
        for backward in ("0", "1"):
            cmd = [sys.executable, __file__, *map(str, ["--rows", args.rows, "--seq", args.seq])]
            cmd += [
                *map(
                    str,
                    ["--vocab", args.vocab, "--hidden", args.hidden, "--worker", variant, chunk, backward],
                )
            ]
            out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            row["train" if backward == "1" else "infer"] = out
        results.append(row)
        ratio = row["train"]["extra_peak_mib"] / results[0]["train"]["extra_peak_mib"]
        print(
            f"{variant:>16} {chunk or '-':>6} {row['infer']['extra_peak_mib']:>9.0f} "
            f"{row['train']['extra_peak_mib']:>12.0f} {row['train']['seconds']:>10.2f} {ratio:>8.2f}x"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"shape": dict(zip(("N", "T", "V", "d"), shape, strict=True)), "results": results}, indent=1
            )
        )


if __name__ == "__main__":
    main()
