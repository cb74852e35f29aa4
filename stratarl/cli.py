"""The `stratarl` command line: one subcommand per user-facing job.

Subcommands import their layer lazily, so `stratarl --help` is instant and a subcommand pays only
for what it uses.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def _demo(args: argparse.Namespace) -> int:
    from stratarl.demo import run_demo

    run_demo(steps=args.steps, seed=args.seed)
    return 0


def _explain_field(args: argparse.Namespace) -> int:
    from stratarl.transport.fields import explain_field

    try:
        print(explain_field(args.name))
    except KeyError as err:
        print(err.args[0])
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stratarl", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="GRPO on a tiny local language model (about a minute on 2 CPUs)")
    demo.add_argument("--steps", type=int, default=30, help="optimizer steps (one rollout batch each)")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(handler=_demo)

    explain = commands.add_parser("explain-field", help="print the contract of a standard batch field")
    explain.add_argument("name", help="field name, e.g. response_mask")
    explain.set_defaults(handler=_explain_field)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)
