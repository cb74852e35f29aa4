"""Every setting does what it says: each schema key is read outside stratarl/config/, and each
choice of a key with `choices` is either built somewhere or refused at validation naming the key."""

import ast
import itertools
from pathlib import Path

import pytest

from stratarl.config import ConfigError, RunConfig, load_config, validate_config
from stratarl.config.setting import leaf_settings, walk_settings

PACKAGE = Path(__file__).resolve().parents[2] / "stratarl"
RECIPE = PACKAGE.parent / "recipes" / "grpo_arithmetic.yaml"

# Choices the code never names because they hold unconditionally, each with the reason.
ALWAYS_BUILT = {
    ("trainer.logger", "jsonl"): "metrics.jsonl is the run's own record, written whether listed or not",
}
# Choices that are only valid together with other settings: the overrides that complete them.
COMPANIONS = {
    ("trainer.resume_mode", "resume_path"): ["trainer.resume_from_path=/tmp/run/checkpoints/global_step_1"],
}


def _chain(node: ast.AST) -> list[str]:
    """`cfg.rollout.val_kwargs.n` -> ["cfg", "rollout", "val_kwargs", "n"]."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        names.append(node.id)
    return names[::-1]


class Reads:
    """What the package outside stratarl/config/ reads of an object, found in its source:
    - `pairs`: consecutive attribute names of every access chain (("rollout", "n") from
      cfg.rollout.n), through local names bound to a section (`r = cfg.rollout; r.n`, and
      `t, d = cfg.trainer, cfg.data`) and parameters annotated with a section's class;
    - `whole_sections`: sections passed whole to `asdict(...)` / `vars(...)` (their fields become
      keyword arguments, e.g. `asdict(cfg.actor.policy_loss)`);
    - `strings`: every string constant (the values a choice is compared with or registered under)."""

    def __init__(self, package: Path, section_classes: dict[str, str]):
        self.section_classes = section_classes  # class name -> its section's last key part
        self.pairs: set[tuple[str, str]] = set()
        self.whole_sections: set[str] = set()
        self.strings: set[str] = set()
        for path in package.rglob("*.py"):
            if path.relative_to(package).parts[0] == "config":
                continue
            self._read(ast.parse(path.read_text(), filename=str(path)))

    def _read(self, tree: ast.Module) -> None:
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for scope in [tree, *functions]:
            aliases = self._aliases(scope)
            for node in ast.walk(scope):
                if isinstance(node, ast.Attribute):
                    chain = _chain(node)
                    if chain and chain[0] in aliases:
                        chain = [aliases[chain[0]], *chain[1:]]
                    self.pairs.update(itertools.pairwise(chain))
                elif isinstance(node, ast.Call) and _called(node) in ("asdict", "vars") and node.args:
                    if isinstance(node.args[0], ast.Attribute):
                        self.whole_sections.add(node.args[0].attr)
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    self.strings.add(node.value)

    def _aliases(self, scope: ast.AST) -> dict[str, str]:
        """Local name -> the section it holds, in this scope (assignments and annotated parameters)."""
        aliases: dict[str, str] = {}
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    pairs = (
                        zip(target.elts, node.value.elts, strict=False)
                        if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                        else [(target, node.value)]
                    )
                    for name, value in pairs:
                        if isinstance(name, ast.Name) and isinstance(value, ast.Attribute):
                            aliases[name.id] = value.attr
            elif isinstance(node, ast.arg) and node.annotation is not None:
                annotation = ast.unparse(node.annotation).split(".")[-1].strip("'\"")
                if annotation in self.section_classes:
                    aliases[node.arg] = self.section_classes[annotation]
        return aliases

    def read(self, key: str) -> bool:
        if any(key in keys for name, keys in derived_reads().items() if ("cfg", name) in self.pairs):
            return True  # read through a RunConfig property the package uses (cfg.uses_critic)
        *sections, leaf = key.split(".")
        if not sections:
            return any(pair[1] == leaf for pair in self.pairs)
        return (sections[-1], leaf) in self.pairs or sections[-1] in self.whole_sections


def derived_reads() -> dict[str, set[str]]:
    """RunConfig's properties and the keys each reads (`uses_critic` -> {"critic.enable", ...})."""
    tree = ast.parse((PACKAGE / "config" / "schema_run.py").read_text())
    config = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RunConfig")
    reads = {}
    for method in config.body:
        if isinstance(method, ast.FunctionDef) and any(
            isinstance(d, ast.Name) and d.id == "property" for d in method.decorator_list
        ):
            chains = [_chain(n) for n in ast.walk(method) if isinstance(n, ast.Attribute)]
            reads[method.name] = {".".join(c[1:]) for c in chains if c[:1] == ["self"] and len(c) > 2}
    return reads


def _called(call: ast.Call) -> str:
    return getattr(call.func, "id", None) or getattr(call.func, "attr", "")


@pytest.fixture(scope="module")
def reads() -> Reads:
    classes = {
        info.cls.__name__: info.key.split(".")[-1]
        for info in walk_settings(RunConfig)
        if hasattr(info, "cls")
    }
    return Reads(PACKAGE, classes)


def test_every_key_of_the_schema_is_read_outside_the_config_package(reads):
    unread = [key for key in leaf_settings(RunConfig) if not reads.read(key)]
    assert not unread, f"settings accepted but never read outside stratarl/config/: {unread}"


def test_the_scan_finds_a_key_nobody_reads(reads):
    """The check itself: a key whose leaf name the package never uses is reported."""
    assert not reads.read("sft.no_such_setting_anywhere")
    assert not reads.read("rollout.loss_scale_factor")  # a real name, but no code reads it there
    assert reads.read("actor.loss_scale_factor")


def _choice_cases() -> list[tuple[str, str]]:
    return [(key, choice) for key, info in leaf_settings(RunConfig).items() for choice in info.choices]


@pytest.mark.parametrize(("key", "choice"), _choice_cases(), ids=lambda v: str(v))
def test_every_choice_is_built_or_refused_naming_its_key(key, choice, reads):
    info = leaf_settings(RunConfig)[key]
    value = f"[jsonl,{choice}]" if key == "trainer.logger" else choice  # a list of choices
    overrides = [f"{key}={value}", *COMPANIONS.get((key, choice), [])]
    cfg = load_config(RECIPE, overrides)
    try:
        validate_config(cfg, check_paths=False)
    except ConfigError as error:  # refused: the message must say which key
        assert key in str(error), f"{key}={choice} refused without naming the key: {error}"
        return
    built = choice in reads.strings or (key, choice) in ALWAYS_BUILT
    assert built, (
        f"{key}={choice} passes validation but no module outside stratarl/config/ names {choice!r}: "
        f"accepted and silently treated as another choice? (choices: {info.choices})"
    )
