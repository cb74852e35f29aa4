"""Layer 5, data: the synthetic integer-arithmetic task, written as verl-schema parquet.

A problem is `a op b [op c ...]` with operands of min..max digits and operators from + - *,
evaluated with the usual precedence. The prompt asks "What is 23+45?" and the only accepted
response is `Answer: 68` (see `stratarl.reward.arithmetic`). Train and test problems are distinct
expressions; the test set is drawn first, so it does not change when n_train does.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stratarl.data.schema import write_rows
from stratarl.reward.arithmetic import DATA_SOURCE, format_answer

OPERATORS = "+-*"
INSTRUCTION = " Reply as 'Answer: <integer>'."


def _draw_operand(rng: random.Random, min_digits: int, max_digits: int) -> int:
    """A number with a uniformly drawn digit count, then uniform among numbers of that length."""
    digits = rng.randint(min_digits, max_digits)
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def evaluate(operands: Sequence[int], ops: Sequence[str]) -> int:
    """a0 op0 a1 op1 a2 ... with * binding tighter than + and -, left to right otherwise."""
    total, sign, term = 0, 1, operands[0]
    for op, x in zip(ops, operands[1:], strict=True):
        if op == "*":
            term *= x
        else:
            total, sign, term = total + sign * term, (1 if op == "+" else -1), x
    return total + sign * term


def _space_size(min_digits: int, max_digits: int, operators: str, num_operands: int) -> int:
    """How many distinct expressions exist, to refuse requests that cannot be met."""
    numbers = sum(10 if d == 1 else 9 * 10 ** (d - 1) for d in range(min_digits, max_digits + 1))
    return numbers**num_operands * len(operators) ** (num_operands - 1)


def draw_expressions(
    count: int, *, digits: tuple[int, int], operators: str, num_operands: int, non_negative: bool, seed: int
) -> list[tuple[str, int]]:
    """`count` distinct (expression, value) pairs, in draw order, from one seeded stream."""
    min_digits, max_digits = digits
    if not 1 <= min_digits <= max_digits:
        raise ValueError(f"digits must satisfy 1 <= min <= max, got {digits}")
    if not operators or set(operators) - set(OPERATORS):
        raise ValueError(f"operators must be a non-empty subset of {OPERATORS!r}, got {operators!r}")
    operators = "".join(op for op in OPERATORS if op in operators)  # dedupe, fixed order
    if num_operands < 2:
        raise ValueError(f"num_operands must be >= 2, got {num_operands}")
    if count > _space_size(min_digits, max_digits, operators, num_operands):
        raise ValueError(
            f"only {_space_size(min_digits, max_digits, operators, num_operands)} distinct "
            f"expressions exist for digits={digits}, operators={operators!r}; asked for {count}"
        )
    rng = random.Random(seed)
    seen: dict[str, int] = {}
    for _ in range(50 * count + 1000):  # enough for any request below the space size in practice
        if len(seen) == count:
            break
        operands = [_draw_operand(rng, min_digits, max_digits) for _ in range(num_operands)]
        ops = [rng.choice(operators) for _ in range(num_operands - 1)]
        expression = str(operands[0]) + "".join(f"{op}{x}" for op, x in zip(ops, operands[1:], strict=True))
        value = evaluate(operands, ops)
        if expression not in seen and (value >= 0 or not non_negative):
            seen[expression] = value
    if len(seen) < count:
        raise ValueError(f"found only {len(seen)} distinct expressions of {count}; widen digits or operators")
    return list(seen.items())


def arithmetic_row(
    expression: str,
    value: int,
    *,
    split: str,
    index: int,
    with_instruction: bool,
    instruction: str = INSTRUCTION,
) -> dict[str, Any]:
    """One verl-schema row. extra_info.answer is the reference response (verl's SFT convention)."""
    question = f"What is {expression}?" + (instruction if with_instruction else "")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": str(value)},
        "extra_info": {
            "split": split,
            "index": index,
            "expression": expression,
            "question": question,
            "answer": format_answer(value),
        },
    }


def make_arithmetic_dataset(
    out_dir: str | Path,
    *,
    n_train: int,
    n_test: int,
    digits: int | tuple[int, int] = (1, 2),
    operators: str = "+-",
    num_operands: int = 2,
    non_negative: bool = False,
    with_instruction: bool = True,
    instruction: str = INSTRUCTION,
    seed: int = 0,
) -> dict[str, Path]:
    """Write `train.parquet` and `test.parquet` under `out_dir`; returns {"train": path, "test": path}.
    `instruction` follows the question (e.g. " End your reply with 'Answer: <integer>'.")."""
    span = (digits, digits) if isinstance(digits, int) else tuple(digits)
    drawn = draw_expressions(
        n_test + n_train,
        digits=span,
        operators=operators,
        num_operands=num_operands,
        non_negative=non_negative,
        seed=seed,
    )
    out, paths = Path(out_dir), {}
    for split, pairs in (("test", drawn[:n_test]), ("train", drawn[n_test:])):
        rows = [
            arithmetic_row(
                expr, value, split=split, index=i, with_instruction=with_instruction, instruction=instruction
            )
            for i, (expr, value) in enumerate(pairs)
        ]
        paths[split] = write_rows(out / f"{split}.parquet", rows)
    return {"train": paths["train"], "test": paths["test"]}


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of `stratarl data make arithmetic`, for a parser the CLI owns."""
    parser.add_argument(
        "--out", required=True, type=Path, help="directory for train.parquet and test.parquet"
    )
    parser.add_argument("--n-train", type=int, default=4000, help="training prompts")
    parser.add_argument("--n-test", type=int, default=200, help="held-out prompts (distinct from training)")
    parser.add_argument(
        "--digits",
        type=int,
        nargs="+",
        default=[1, 2],
        metavar="D",
        help="digits per operand: one value, or MIN MAX (default 1 2)",
    )
    parser.add_argument("--operators", default="+-", help=f"operators to use, a subset of {OPERATORS!r}")
    parser.add_argument("--operands", type=int, default=2, help="operands per expression")
    parser.add_argument("--non-negative", action="store_true", help="keep only problems with a result >= 0")
    parser.add_argument("--no-instruction", action="store_true", help="omit the answer-format sentence")
    parser.add_argument(
        "--instruction",
        default=INSTRUCTION,
        help=f"the sentence after the question (default {INSTRUCTION!r})",
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser


def run_from_args(args: argparse.Namespace) -> int:
    if len(args.digits) not in (1, 2):
        raise SystemExit(f"--digits takes one value or MIN MAX, got {args.digits}")
    paths = make_arithmetic_dataset(
        args.out,
        n_train=args.n_train,
        n_test=args.n_test,
        digits=(args.digits[0], args.digits[-1]),
        operators=args.operators,
        num_operands=args.operands,
        non_negative=args.non_negative,
        with_instruction=not args.no_instruction,
        instruction=args.instruction,
        seed=args.seed,
    )
    print(f"wrote {args.n_train} train prompts to {paths['train']}")
    print(f"wrote {args.n_test} test prompts to {paths['test']}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Write the arithmetic task as verl-schema parquet (train and test splits)."""
    parser = argparse.ArgumentParser(prog="stratarl data make arithmetic", description=main.__doc__)
    return run_from_args(add_arguments(parser).parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
