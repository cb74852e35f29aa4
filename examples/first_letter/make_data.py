"""An example of bringing your own task (docs/own_task.md#three-more-tasks): copy from the prompt the
one word of a list that starts with a given letter, as verl-schema parquet.

"Which word starts with 'k': lamp, kite, river, owl? Reply as 'Answer: <word>'." → "Answer: kite".
Each row: data_source "first_letter", a one-message chat prompt, reward_model.ground_truth = the
word, extra_info.answer = the reference response used by SFT. Train and test hold distinct lists.
Run: python examples/first_letter/make_data.py --out data/first_letter
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

DATA_SOURCE = "first_letter"

# A few hundred common English words (3–8 letters), written here so the example needs no download.
WORDS = """
apple arm baby back bag ball band bank bath bear bed bell bird black blue boat body bone book boot
bowl box boy bread bridge brother brown bus butter cake camera candle car card cat chair cheese
chicken child church city class clock cloud coat coffee cold color corn cow cup dance day desk
dinner doctor dog door dream dress drink duck earth egg engine eye face farm father field finger
fire fish flag floor flower fly food foot forest fork friend frog fruit game garden gate girl
glass gold grass green hair hand hat head heart hill horse hospital hotel house ice island jacket
jam jar juice key king kitchen kite knife lake lamp leaf leg lemon letter light lion lip lunch map
market milk money monkey moon morning mother mountain mouse mouth music nail name neck needle nest
night nose ocean office oil orange owl page paint paper park party pen pencil people piano picture
pig pillow pink plane plant plate pocket pond potato queen rabbit rain red rice ring river road
rock roof room rope rose salt sand school sea seed sheep ship shirt shoe shop silver sister skirt
sky snake snow sock soup spoon spring star station stone street sugar summer sun table tail tea
teacher tent tiger time toe tomato tooth tower town toy train tree truck uncle village wall watch
water wheel white wind window wine winter wolf wood world yard yellow zebra able angry brave
bright busy calm clean clever close cool dark deep dirty dry early easy empty fast fat fresh full
funny gentle happy hard heavy high hot huge kind large late lazy long loud low lucky narrow new
nice noisy old poor proud quick quiet rich round sad safe sharp short shy slow small smooth soft
strong sweet tall thin tiny warm weak wet wide wild wise young
""".split()  # noqa: SIM905 (a list literal of 308 strings reads worse)


def draw(rng: random.Random, count: int) -> tuple[str, str]:
    """A list of `count` words with distinct first letters, and the letter of one of them."""
    chosen: dict[str, str] = {}
    while len(chosen) < count:
        word = rng.choice(WORDS)
        chosen.setdefault(word[0], word)
    words = list(chosen.values())
    target = rng.choice(words)
    question = f"Which word starts with '{target[0]}': {', '.join(words)}? Reply as 'Answer: <word>'."
    return question, target


def row(question: str, truth: str, split: str, index: int) -> dict:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question}],
        "ability": "copying",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": split, "index": index, "answer": f"Answer: {truth}"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--n-train", type=int, default=2000)
    parser.add_argument("--n-test", type=int, default=200)
    parser.add_argument("--min-count", type=int, default=4, help="fewest words in a list")
    parser.add_argument("--max-count", type=int, default=6, help="most words in a list")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng, seen, pairs = random.Random(args.seed), set(), []
    while len(pairs) < args.n_train + args.n_test:
        drawn = draw(rng, rng.randint(args.min_count, args.max_count))
        if drawn[0] not in seen:
            seen.add(drawn[0])
            pairs.append(drawn)
    args.out.mkdir(parents=True, exist_ok=True)
    splits = {"test": pairs[: args.n_test], "train": pairs[args.n_test :]}  # test drawn first
    for split, chosen in splits.items():
        rows = [row(question, truth, split, i) for i, (question, truth) in enumerate(chosen)]
        pq.write_table(pa.Table.from_pylist(rows), args.out / f"{split}.parquet")
        print(f"wrote {len(rows)} {split} rows to {args.out / f'{split}.parquet'}")


if __name__ == "__main__":
    main()
