"""An example of bringing your own task (docs/own_task.md): sort 3–6 digits, as verl-schema parquet.

Each row: data_source "sort_numbers", a one-message chat prompt, reward_model.ground_truth = the
sorted numbers, extra_info.answer = the reference response used by SFT. Train and test hold
distinct lists. Run: python examples/sort_numbers/make_data.py --out data/sort
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

DATA_SOURCE = "sort_numbers"


def row(numbers: list[int], split: str, index: int) -> dict:
    question = f"Sort in ascending order: {' '.join(map(str, numbers))}. Reply as 'Answer: <numbers>'."
    truth = " ".join(map(str, sorted(numbers)))
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question}],
        "ability": "sorting",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": split, "index": index, "answer": f"Answer: {truth}"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--n-train", type=int, default=2000)
    parser.add_argument("--n-test", type=int, default=200)
    parser.add_argument("--min-count", type=int, default=3, help="fewest numbers in a list")
    parser.add_argument("--max-count", type=int, default=6, help="most numbers in a list")
    parser.add_argument("--max-number", type=int, default=9, help="numbers are drawn from 0..max")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng, seen, lists = random.Random(args.seed), set(), []
    while len(lists) < args.n_train + args.n_test:
        numbers = [rng.randint(0, args.max_number) for _ in range(rng.randint(args.min_count, args.max_count))]
        if tuple(numbers) not in seen:
            seen.add(tuple(numbers))
            lists.append(numbers)
    args.out.mkdir(parents=True, exist_ok=True)
    splits = {"test": lists[: args.n_test], "train": lists[args.n_test :]}  # test drawn first
    for split, chosen in splits.items():
        rows = [row(numbers, split, i) for i, numbers in enumerate(chosen)]
        pq.write_table(pa.Table.from_pylist(rows), args.out / f"{split}.parquet")
        print(f"wrote {len(rows)} {split} rows to {args.out / f'{split}.parquet'}")


if __name__ == "__main__":
    main()
