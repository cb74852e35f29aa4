"""The `stratarl` command line: one subcommand per user-facing job.

Subcommands import their layer lazily, so `stratarl --help` is instant and a subcommand pays only
for what it uses. A mistake in the config or the inputs (a `ConfigError`, a refused run directory)
prints one message and exits with code 2; an OSError (a full disk, a read-only directory)
prints one line naming the file and the errno and exits with code 1; `--debug` shows the
traceback instead. Ctrl-C prints one line and exits with code 130 (`train` and `sft` stop at a
safe point: `trainer.interruption`).
"""

from __future__ import annotations

import argparse
import errno
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from stratarl import cli_help

EXIT_USAGE = 2  # config and input errors, as argparse exits on a bad command line
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports it


class InputError(ValueError):
    """A command's input cannot be used (a file, a function name, a directory): one message."""


def _default_run_dir(name: str) -> Path:
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _quickstart(args: argparse.Namespace) -> int:
    if args.run_dir and Path(args.run_dir).is_dir() and any(Path(args.run_dir).iterdir()):
        from stratarl.run_directory.lock import RunDirectoryError

        raise RunDirectoryError(
            f"refusing to start the quickstart in {args.run_dir}: it is not empty, and a new run there "
            "would mix with what it holds. Give another --run-dir (or leave it out for a fresh one)."
        )
    if args.task == "tool":
        from stratarl.apps.tool_quickstart import ToolTaskSettings, run_tool_quickstart

        run_dir = args.run_dir or _default_run_dir("quickstart-tool")
        task = ToolTaskSettings(model_size=args.model_size) if args.model_size else ToolTaskSettings()
        run_tool_quickstart(run_dir, seed=args.seed, overrides=args.overrides, task=task)
        return 0
    from stratarl.apps.quickstart import TaskSettings, run_quickstart

    task = TaskSettings(model_size=args.model_size or "1m")
    run_quickstart(
        args.run_dir or _default_run_dir("quickstart"), seed=args.seed, overrides=args.overrides, task=task
    )
    return 0


def _train(args: argparse.Namespace) -> int:
    from stratarl.config import load_config, validate_config

    cfg = load_config(args.recipe, args.overrides)
    validate_config(cfg)  # config and path mistakes before torch loads (seconds; 14 s on a busy CPU)
    return _fit(cfg)


def _fit(cfg, on_claimed=None) -> int:
    """RL training of a validated config; `on_claimed(run_dir)` runs once the run directory is ours."""
    from stratarl.run_directory.claim import default_run_dir
    from stratarl.trainer.interruption import StopRequest
    from stratarl.trainer.rl_trainer import RLTrainer

    # The same on every launch: running the command again resumes the run from its newest
    # checkpoint (trainer.resume_mode=auto), as verl's default_local_dir does.
    run_dir = default_run_dir(cfg)
    trainer = RLTrainer(cfg, run_dir)
    if on_claimed is not None:
        on_claimed(run_dir)
    trainer.fit(stop=StopRequest())
    return 0


def _verl(args: argparse.Namespace) -> int:
    from stratarl.config.batch_plan import BatchPlan
    from stratarl.config.verl_translation import load_verl_config

    cfg, translation = load_verl_config(
        args.overrides, config_path=args.config_path, config_name=args.config_name
    )  # refused keys and config mistakes in verl's names and ours, before torch loads
    if args.dry_run:
        print("\n".join(translation.lines()))
        print(BatchPlan.from_config(cfg).to_text())
        return 0
    return _fit(cfg, on_claimed=lambda run_dir: translation.write(run_dir, args.overrides))


def _config(args: argparse.Namespace) -> int:
    """The resolved config of a run directory (its config.yaml) or a recipe, as YAML or a verl line."""
    from stratarl.config import load_config
    from stratarl.config.loading import to_yaml

    source = Path(args.source)
    if source.is_dir():
        if not (source / "config.yaml").is_file():
            raise InputError(f"{source} holds no config.yaml: give a run directory, or a recipe file")
        source = source / "config.yaml"
    elif not source.is_file():
        raise InputError(f"{source}: no such run directory or recipe file")
    cfg = load_config(source, args.overrides)  # keys and types; the files may live on another machine
    if not args.as_verl:
        print(to_yaml(cfg), end="")
        return 0
    from stratarl.config.verl_way_back import as_verl

    print(f"# {args.source} as a verl 0.9.1 command line (stratarl config --as-verl)")
    print(as_verl(cfg).text())
    return 0


def _sft(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from stratarl.config import load_config, validate_config
    from stratarl.config.sft_scope import sft_warnings

    cfg = load_config(args.recipe, args.overrides)
    validate_config(cfg)  # its warnings are the RL run's; SFT prints those about what it reads
    from stratarl.run_directory.claim import default_run_dir
    from stratarl.trainer.interruption import StopRequest
    from stratarl.trainer.sft import sft_from_config

    console = Console()
    for warning in sft_warnings(cfg, args.overrides):
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False, soft_wrap=True)
    sft_from_config(cfg, default_run_dir(cfg, suffix="-sft"), console=console, stop=StopRequest())
    return 0


def _init(args: argparse.Namespace) -> int:
    from stratarl.apps.task_init import init_task

    out = Path(args.out)
    if out.is_dir() and any(out.iterdir()):
        raise InputError(f"{out} is not empty: give `stratarl init` a new --out directory")
    try:
        recipe, profile, warnings = init_task(
            args.train, out, val_files=args.val, reward_file=args.reward or "",
            reward_function=args.reward_function, size=args.size, vocab_size=args.vocab_size, seed=args.seed,
            model_path=args.model or "", sft_share=args.sft_share,
        )  # fmt: skip
    except (ValueError, OSError, ImportError, AttributeError, TypeError) as err:
        raise InputError(str(err)) from err
    print("\n".join(profile.lines()))
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    from stratarl.config import load_config
    from stratarl.run_directory.claim import default_run_dir

    sft_final = default_run_dir(load_config(recipe), suffix="-sft") / "final"
    model = args.model or f"a {args.size} model with its tokenizer, in {out / 'model'}"
    print(f"wrote the recipe {recipe} for {model}")
    print(f"next: stratarl sft {recipe}")
    print(f"then: stratarl train {recipe} model.path={sft_final}")
    return 0


def _data(args: argparse.Namespace) -> int:
    return args.task_module.run_from_args(args)


def _import_gguf(args: argparse.Namespace) -> int:
    from stratarl.data.gguf_import import import_gguf

    report = import_gguf(args.gguf, args.out)
    print(f"{report.architecture}, {report.num_parameters:,} parameters, vocabulary {report.vocab_size:,}")
    for check in report.greedy_checks:
        print(f"greedy check {check['prompt']!r}: same tokens as the GGUF -> {check['continuation']!r}")
    print(f"wrote {report.out_dir} in {report.seconds} s")
    return 0


def _explain_field(args: argparse.Namespace) -> int:
    from stratarl.transport.field_docs import explain_field

    try:
        print(explain_field(args.name))
    except KeyError as err:
        print(err.args[0])
        return 2
    return 0


def _trace(args: argparse.Namespace) -> int:
    from stratarl.observe.trace_command import trace_command

    return trace_command(
        args.run,
        step=args.step,
        uid=args.uid,
        sample=args.sample,
        worst=args.worst,
        best=args.best,
        where=args.where,
        html=args.html,
        field=args.field,
    )


def _doctor(args: argparse.Namespace) -> int:
    from stratarl.observe.doctor.diagnosis import doctor_command

    return doctor_command(args.run, as_json=args.json)


def _plot(args: argparse.Namespace) -> int:
    from stratarl.observe.plots import plot_run_dir

    for path in plot_run_dir(args.run, args.out):
        print(path)
    return 0


def _add_observe_commands(commands: argparse._SubParsersAction) -> None:
    """`trace`, `doctor` and `plot`: read a run directory (finished or still running)."""
    trace = commands.add_parser(
        "trace",
        help="the ten questions answered for one trajectory of a run",
        **_epilog(cli_help.observe_epilog("trace")),
    )
    trace.add_argument("run", help="run directory (or a quickstart directory: its grpo/ run)")
    trace.add_argument("--step", type=int, help="training step (default: the last traced step)")
    pick = trace.add_mutually_exclusive_group()
    pick.add_argument("--uid", help="the prompt group's uid (or a trajectory id uid/sample)")
    pick.add_argument("--worst", action="store_true", help="the trajectory with the lowest reward")
    pick.add_argument("--best", action="store_true", help="the trajectory with the highest reward")
    trace.add_argument(
        "--sample", type=int, help="with --uid: its sample index; alone: the step's i-th trajectory"
    )
    trace.add_argument("--where", help='the first trajectory for which this holds, e.g. "reward == 0"')
    trace.add_argument("--html", metavar="PATH", help="write one self-contained HTML page instead")
    trace.add_argument("--field", help="follow a batch field through the phases, e.g. old_log_probs")
    trace.set_defaults(handler=_trace)

    doctor = commands.add_parser(
        "doctor",
        help="what is wrong with a run, and in which layer",
        **_epilog(cli_help.observe_epilog("doctor")),
    )
    doctor.add_argument("run", help="run directory (or a quickstart directory: its grpo/ run)")
    doctor.add_argument("--json", action="store_true", help="print the findings as JSON")
    doctor.set_defaults(handler=_doctor)

    plot = commands.add_parser(
        "plot",
        help="PNG curves of a run (reward, KL, entropy, lengths, times, staleness)",
        **_epilog(cli_help.observe_epilog("plot")),
    )
    plot.add_argument("run", help="run directory (or a quickstart directory: its grpo/ run)")
    plot.add_argument("--out", help="folder for the PNGs (default: RUN/plots)")
    plot.set_defaults(handler=_plot)


def _epilog(text: str) -> dict:
    """add_parser's keywords for an epilog printed as written (`cli_help`)."""
    return {"epilog": text, "formatter_class": argparse.RawDescriptionHelpFormatter}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stratarl",
        description=__doc__.splitlines()[0],
        **_epilog("Each command's --help names its main settings; every setting: docs/config.md."),
    )
    debug = argparse.ArgumentParser(add_help=False)  # --debug before or after the subcommand
    debug.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show the traceback of an error"
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of a config or input error")
    commands = parser.add_subparsers(dest="command", required=True)

    quick = commands.add_parser(
        "quickstart",
        parents=[debug],
        help="data + tiny model, SFT, then GRPO; reports held-out accuracy (what `make demo` runs)",
        **_epilog(cli_help.quickstart_epilog()),
    )
    quick.add_argument("--run-dir", help="where everything is written (default runs/quickstart-<time>)")
    quick.add_argument("--seed", type=int, default=0)
    quick.add_argument("--model-size", help="tiny model preset (1m, 5m, 10m, 50m); default: 1m")
    quick.add_argument(
        "--task",
        choices=("arithmetic", "tool"),
        default="arithmetic",
        help="arithmetic: + and − in one turn; tool: multiplication with a calculator tool (multi-turn)",
    )
    quick.add_argument(
        "overrides", nargs="*", help="dotted config overrides, e.g. sft.total_steps=200 rollout.n=8"
    )
    quick.set_defaults(handler=_quickstart)

    train = commands.add_parser(
        "train",
        parents=[debug],
        help="RL training from a recipe: stratarl train RECIPE [key=value ...]",
        **_epilog(cli_help.train_epilog()),
    )
    train.add_argument("recipe", help="YAML recipe (overrides of the defaults in docs/config.md)")
    train.add_argument(
        "overrides", nargs="*", help="dotted config overrides, e.g. algorithm.adv_estimator=grpo"
    )
    train.set_defaults(handler=_train)

    verl = commands.add_parser(
        "verl",
        parents=[debug],
        help="a verl command line (verl.trainer.main_ppo's KEY=VALUE ...) from verl's defaults, trained here",
        **_epilog(cli_help.verl_epilog()),
    )
    verl.add_argument("--config-path", "-cp", help="directory of a verl YAML config (Hydra's --config-path)")
    verl.add_argument("--config-name", "-cn", help="its name, without .yaml; default: verl's ppo_trainer")
    verl.add_argument("--dry-run", action="store_true", help="print the translation and the batch plan only")
    verl.add_argument("overrides", nargs="*", help="Hydra overrides: key=value, +key=value, ~key")
    verl.set_defaults(handler=_verl)

    config = commands.add_parser(
        "config",
        parents=[debug],
        help="print the resolved config of a run or a recipe; --as-verl: as a verl command line",
        **_epilog(cli_help.config_epilog()),
    )
    config.add_argument("source", help="a run directory (its config.yaml) or a YAML recipe")
    config.add_argument("overrides", nargs="*", help="dotted config overrides, as `stratarl train` takes")
    config.add_argument(
        "--as-verl",
        action="store_true",
        help="print verl's `python3 -m verl.trainer.main_ppo ...` line that trains the same run",
    )
    config.set_defaults(handler=_config)

    sft = commands.add_parser(
        "sft",
        parents=[debug],
        help="supervised warm-start from a recipe: stratarl sft RECIPE [key=value ...]",
        **_epilog(cli_help.sft_epilog()),
    )
    sft.add_argument("recipe", help="YAML recipe; uses data.*, model.*, sft.* and rollout.val_kwargs")
    sft.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. sft.total_steps=200")
    sft.set_defaults(handler=_sft)

    init = commands.add_parser(
        "init",
        parents=[debug],
        help="your own task: a tokenizer, a tiny model and a starter recipe for verl-schema parquet",
        **_epilog(cli_help.init_epilog()),
    )
    init.add_argument("train", nargs="+", help="training parquet file(s) in verl's schema")
    init.add_argument("--val", nargs="*", default=[], help="validation parquet file(s)")
    init.add_argument("--out", required=True, help="new directory for model/ and recipe.yaml")
    init.add_argument("--reward", help="python file with your compute_score (default: the built-in registry)")
    init.add_argument("--reward-function", default="compute_score", help="its function name")
    init.add_argument("--size", default="1m", help="tiny model preset: 1m, 5m, 10m, 50m (docs/own_task.md)")
    init.add_argument("--vocab-size", type=int, default=1024, help="upper bound of the BPE vocabulary")
    init.add_argument("--seed", type=int, default=0, help="seed of the model's initialisation")
    init.add_argument("--model", help="an HF model directory to use instead of a new tiny model")
    init.add_argument(
        "--sft-share",
        type=float,
        default=1.0,  # task_init.SFT_SHARE (not imported: --help stays instant)
        help="share of the training rows for SFT (sft.train_files), the rest for GRPO (data.train_files); "
        "1: both train on every row (the default, docs/own_task.md says why)",
    )
    init.set_defaults(handler=_init)

    data = commands.add_parser(
        "data", help="write synthetic tasks as verl-schema parquet", **_epilog(cli_help.data_epilog())
    )
    data_commands = data.add_subparsers(dest="data_command", required=True)
    make = data_commands.add_parser("make", help="make a dataset")
    make_tasks = make.add_subparsers(dest="task", required=True)
    from stratarl.data.tasks import arithmetic, tool_arithmetic

    tasks = {
        "arithmetic": (arithmetic, "integer arithmetic with train and test splits"),
        "tool_arithmetic": (tool_arithmetic, "multiplication that needs a calculator tool, with tools.yaml"),
    }
    for name, (module, help_text) in tasks.items():
        task = make_tasks.add_parser(name, help=help_text, **_epilog(cli_help.data_epilog()))
        module.add_arguments(task)
        task.set_defaults(handler=_data, task_module=module)

    model = commands.add_parser("model", help="prepare model directories", **_epilog(cli_help.model_epilog()))
    model_commands = model.add_subparsers(dest="model_command", required=True)
    gguf = model_commands.add_parser(
        "import-gguf",
        help="a GGUF causal LM as a plain HF directory (float32), checked greedy-equal to the GGUF",
        **_epilog(cli_help.model_epilog()),
    )
    gguf.add_argument("gguf", help="the .gguf file (needs the gguf package)")
    gguf.add_argument("out", help="directory to write (config, safetensors, tokenizer, chat template)")
    gguf.set_defaults(handler=_import_gguf)

    explain = commands.add_parser(
        "explain-field",
        help="print the contract of a standard batch field",
        **_epilog(cli_help.explain_field_epilog()),
    )
    explain.add_argument("name", help="field name, e.g. response_mask")
    explain.set_defaults(handler=_explain_field)
    _add_observe_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from stratarl.config import ConfigError
    from stratarl.run_directory.lock import RunDirectoryError
    from stratarl.trainer.interruption import RunInterrupted

    try:
        return args.handler(args)
    except (ConfigError, RunDirectoryError, InputError) as err:
        return _report(args, err, EXIT_USAGE)
    except RunInterrupted as err:  # stopped at a safe point: the line says what is saved
        return _report(args, err, EXIT_INTERRUPTED)
    except KeyboardInterrupt as err:  # before a run's steps began, or a command that has none
        nothing = "; nothing of this start is saved" if args.command in ("train", "sft", "verl") else ""
        return _report(args, err, EXIT_INTERRUPTED, message=f"interrupted (Ctrl-C){nothing}")
    except OSError as err:  # a full disk, a read-only directory, a file gone: the file and the errno
        return _report(args, err, EXIT_FAILED, message=_os_error_line(err))


def _os_error_line(err: OSError) -> str:
    """One line naming the file and the errno (a CheckpointWriteError's message already does)."""
    from stratarl.engine.checkpoint import CheckpointWriteError

    if isinstance(err, CheckpointWriteError) or not err.errno:
        return str(err)
    code = errno.errorcode.get(err.errno, str(err.errno))
    where = f"{err.filename}: " if err.filename else ""
    return f"{where}{err.strerror} (errno {err.errno}, {code})"


def _report(args: argparse.Namespace, err: BaseException, code: int, *, message: str = "") -> int:
    """One message on stderr instead of a traceback (which --debug asks for)."""
    if args.debug:
        raise err
    print(f"stratarl {args.command}: {message or err}", file=sys.stderr)
    return code
