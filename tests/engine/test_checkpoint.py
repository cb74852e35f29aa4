"""Checkpoints: an exact resume, atomic publication, retention within one run, HF export, fallback past a
broken one, and a failed write (a full disk) that names its file and errno and leaves the previous one."""

import errno
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from stratarl.engine.actor import Actor, OptimizerSettings, compute_log_probs
from stratarl.engine.checkpoint import (
    MANIFEST,
    TRACKER,
    CheckpointManager,
    CheckpointWriteError,
    checkpoint_problem,
)
from stratarl.engine.critic import Critic, value_model_from_causal_lm
from stratarl.engine.requests import UpdateRequest
from tests.engine.test_critic import critic_batch, value_loss
from tests.engine.tiny_batches import policy_gradient_loss, ragged_batch, tiny_model

ROOT = Path(__file__).resolve().parents[2]


def make_roles(seed):
    actor = Actor(
        tiny_model(seed),
        optim=OptimizerSettings(lr=1e-2, lr_schedule="cosine", warmup_steps=1, total_steps=5),
        micro_batch_size=4,
    )
    critic = Critic(
        value_model_from_causal_lm(tiny_model(seed)), optim=OptimizerSettings(lr=1e-2), micro_batch_size=4
    )
    return {"actor": actor, "critic": critic}


def step(roles, batch):
    """One RL step whose mini-batch order draws on the global RNG (so RNG state matters)."""
    seed = int(torch.randint(0, 1000, ()))
    roles["actor"].update(batch, policy_gradient_loss, UpdateRequest(mini_batch_size=4, shuffle_seed=seed))
    roles["critic"].update(batch, value_loss, UpdateRequest(mini_batch_size=4, shuffle_seed=seed))


def params(roles):
    return {
        f"{r}.{n}": p.detach().clone() for r, role in roles.items() for n, p in role.module.named_parameters()
    }


def test_resume_gives_bit_identical_next_step(tmp_path):
    torch.manual_seed(0)
    roles = make_roles(seed=0)
    batch = critic_batch(roles["critic"])
    step(roles, batch)
    manager = CheckpointManager(tmp_path)
    manager.save(1, roles, hf_policy=roles["actor"], trainer_state={"epoch": 0, "row": 8})
    after_save = (random.random(), float(np.random.rand()))
    step(roles, batch)
    expected = params(roles)

    random.seed(123), np.random.seed(123), torch.manual_seed(123)  # scramble every RNG
    fresh = make_roles(seed=7)  # other initial weights, fresh optimizer and schedule
    loaded = manager.load(fresh)
    assert loaded.step == 1 and loaded.trainer_state == {"epoch": 0, "row": 8} and not loaded.skipped
    assert (random.random(), float(np.random.rand())) == after_save
    step(fresh, batch)
    got = params(fresh)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
    assert fresh["actor"].optimizer.param_groups[0]["lr"] == roles["actor"].optimizer.param_groups[0]["lr"]


def test_hf_export_at_every_save_loads_with_from_pretrained(tmp_path):
    roles = make_roles(seed=0)
    batch = ragged_batch()
    roles["actor"].update(batch, policy_gradient_loss, UpdateRequest(mini_batch_size=8))
    path = CheckpointManager(tmp_path).save(3, {"actor": roles["actor"]}, hf_policy=roles["actor"])
    loaded = AutoModelForCausalLM.from_pretrained(path / "huggingface")
    lp, _ = compute_log_probs(loaded, batch, micro_batch_size=8, temperature=1.0)
    torch.testing.assert_close(lp, roles["actor"].compute_log_prob(batch)[0], atol=0, rtol=0)


def test_layout_pointer_and_retention(tmp_path):
    actor = make_roles(seed=0)["actor"]
    manager = CheckpointManager(tmp_path, max_to_keep=2)
    for n in (1, 2, 3, 4):
        manager.save(n, {"actor": actor})
    assert manager.steps() == [4, 3] and manager.latest_pointer() == 4
    assert (tmp_path / TRACKER).read_text() == "4\n"
    files = {
        p.relative_to(tmp_path / "global_step_4").as_posix() for p in (tmp_path / "global_step_4").rglob("*")
    }
    assert {"actor/model.pt", "actor/optimizer.pt", "actor/extra.pt", "rng/rank_0.pt", MANIFEST} <= files
    assert not list(tmp_path.glob(".tmp-*"))
    manager.save(4, {"actor": actor})  # saving the same step again replaces it
    assert manager.steps() == [4, 3] and checkpoint_problem(tmp_path / "global_step_4") is None


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda d: (d / MANIFEST).unlink(), "manifest.json is missing"),
        (lambda d: (d / "actor" / "optimizer.pt").unlink(), "actor/optimizer.pt is missing"),
        (lambda d: (d / "actor" / "model.pt").write_bytes(b"truncated"), "actor/model.pt has 9 bytes"),
        (lambda d: _flip_a_byte(d / "actor" / "model.pt"), "actor/model.pt does not match its sha256"),
    ],
)
def test_a_broken_latest_checkpoint_is_detected_and_the_previous_one_used(tmp_path, damage, reason):
    roles = make_roles(seed=0)
    actor = roles["actor"]
    manager = CheckpointManager(tmp_path)
    manager.save(1, {"actor": actor})
    saved = {n: p.detach().clone() for n, p in actor.module.named_parameters()}
    actor.update(ragged_batch(), policy_gradient_loss, UpdateRequest(mini_batch_size=8))
    manager.save(2, {"actor": actor})
    damage(tmp_path / "global_step_2")
    fresh = make_roles(seed=3)["actor"]
    with pytest.warns(
        UserWarning, match=f"global_step_2 is incomplete or corrupted: {reason}.*using global_step_1"
    ):
        loaded = manager.load({"actor": fresh})
    assert loaded.step == 1 and len(loaded.skipped) == 1
    for name, tensor in fresh.module.named_parameters():
        assert torch.equal(tensor, saved[name])


def test_a_crash_mid_save_leaves_the_previous_checkpoint_in_charge(tmp_path):
    actor = make_roles(seed=0)["actor"]
    manager = CheckpointManager(tmp_path)
    manager.save(1, {"actor": actor})
    (tmp_path / ".tmp-global_step_2" / "actor").mkdir(parents=True)  # what a crash before publishing leaves
    assert manager.find_latest() == (1, [])
    assert CheckpointManager(tmp_path / "nothing").load({"actor": actor}) is None


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_staged_role_joins_the_checkpoint_atomically_and_a_crash_between_leaves_none(tmp_path):
    """A critic on ranks of its own writes its part first; until the policy's save adopts it, no
    global_step_N exists, and the next save clears the leftovers."""
    roles = make_roles(seed=0)
    actor_only = {"actor": roles["actor"]}
    manager = CheckpointManager(tmp_path)
    manager.save(1, actor_only)
    manager.stage_role(2, "critic", roles["critic"])  # ... and the process dies before the save
    assert manager.steps() == [1] and manager.find_latest() == (1, [])
    with pytest.raises(ValueError, match=r"roles \['critic'\] were not staged for step 3"):
        manager.save(3, actor_only, staged=["critic"])
    manager.stage_role(3, "critic", roles["critic"])
    path = manager.save(3, actor_only, staged=["critic"])
    assert not list(tmp_path.glob(".staged-*")) and not list(tmp_path.glob(".tmp-*"))
    files = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()}
    assert {"critic/model.pt", "critic/optimizer.pt", "critic/extra.pt", "actor/model.pt"} <= files
    (path / "critic" / "extra.pt").unlink()  # the manifest covers the staged files too
    assert checkpoint_problem(path) == "critic/extra.pt is missing"


def test_a_role_loaded_alone_gets_the_saved_state(tmp_path):
    roles = make_roles(seed=0)
    manager = CheckpointManager(tmp_path)
    manager.stage_role(1, "critic", roles["critic"])
    manager.save(1, {"actor": roles["actor"]}, staged=["critic"])
    fresh = make_roles(seed=4)["critic"]
    manager.load_role(1, "critic", fresh)
    for (name, saved), loaded in zip(
        roles["critic"].module.state_dict().items(), fresh.module.state_dict().values(), strict=True
    ):
        assert torch.equal(saved, loaded), name
    with pytest.raises(ValueError, match="holds no 'reward_model'"):
        manager.load_role(1, "reward_model", fresh)


def test_retention_removes_only_older_checkpoints_of_the_callers_run(tmp_path):
    """Another run's checkpoints (steps 5, 6) beside this run's 1..3 are never removed, even when
    their step numbers are higher; the newest max_to_keep of this run's stay."""
    actor = make_roles(seed=0)["actor"]
    manager = CheckpointManager(tmp_path)
    for n in (5, 6, 1, 2, 3):
        manager.save(n, {"actor": actor}, trainer_state={"run": "old" if n > 4 else "new"})

    def ours(directory):
        return torch.load(directory / "trainer_state.pt", weights_only=False)["run"] == "new"

    assert manager.prune(2, newest=3, belongs=ours) == [1]
    assert manager.steps() == [6, 5, 3, 2]
    assert manager.prune(1, newest=3) == [2]  # without a filter: every older one, never a newer one
    assert manager.steps() == [6, 5, 3]


ENOSPC_SCRIPT = """
import errno, json, sys, torch
from pathlib import Path
from stratarl.engine.checkpoint import CheckpointManager, CheckpointWriteError, checkpoint_problem
from tests.engine.test_checkpoint import make_roles

root = Path(sys.argv[1]) / "checkpoints"
roles = make_roles(seed=0)
manager = CheckpointManager(root, max_to_keep=1)
manager.save(1, roles, hf_policy=roles["actor"], trainer_state={"step": 1})
saved = {n: p.detach().clone() for n, p in roles["actor"].module.named_parameters()}
with torch.no_grad():
    for p in roles["actor"].module.parameters():
        p.add_(1.0)
try:
    manager.save(2, roles, hf_policy=roles["actor"], trainer_state={"step": 2})
    error = None
except CheckpointWriteError as err:
    error = {"errno": err.errno, "message": str(err)}
fresh = make_roles(seed=5)
loaded = manager.load(fresh)
same = all(torch.equal(p, saved[n]) for n, p in fresh["actor"].module.named_parameters())
print(json.dumps({
    "error": error, "latest": manager.find_latest()[0], "problem": checkpoint_problem(root / "global_step_1"),
    "loaded": loaded.step, "state": loaded.trainer_state, "same_weights": same,
    "left": sorted(p.name for p in root.iterdir()),
}))
"""


def _can_mount_a_private_tmpfs() -> bool:
    probe = ["unshare", "-rm", "sh", "-c", "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _can_mount_a_private_tmpfs(), reason="needs unshare -rm to mount a private tmpfs")
def test_a_full_disk_names_the_file_and_enospc_and_leaves_the_previous_checkpoint_loadable(tmp_path):
    """A real ENOSPC: the save runs on a 320 KiB tmpfs (mounted in a private user and mount namespace)
    that holds one checkpoint of the tiny roles (~200 KiB) but not a second beside it."""
    code = 'mount -t tmpfs -o size=320k tmpfs "$0" && exec "$1" -c "$2" "$0"'
    command = ["unshare", "-rm", "sh", "-c", code, str(tmp_path), sys.executable, ENOSPC_SCRIPT]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["error"] is not None, "the second save fitted: the tmpfs is too large to test anything"
    assert result["error"]["errno"] == errno.ENOSPC
    message = result["error"]["message"]
    assert "ENOSPC (No space left on device)" in message and "global_step_2" in message
    assert re.search(r"writing \S+\.tmp-global_step_2/\S+ failed", message), message
    assert "global_step_1 is intact and a resume uses it" in message
    assert result["latest"] == 1 and result["problem"] is None
    assert result["loaded"] == 1 and result["state"] == {"step": 1} and result["same_weights"]
    assert result["left"] == ["global_step_1", TRACKER]  # the partial save is gone


def test_an_os_error_at_any_write_leaves_the_previous_checkpoint_and_names_the_file(tmp_path, monkeypatch):
    """The same without a tmpfs: EACCES injected at the k-th file write (the write call itself)."""
    roles = make_roles(seed=0)
    manager = CheckpointManager(tmp_path)
    manager.save(1, roles, hf_policy=roles["actor"])
    real_save = torch.save
    for k in range(1, 8):  # actor model, optimizer, extra, critic ..., rng
        calls = []

        def failing_save(obj, f, *args, k=k, calls=calls, **kwargs):
            calls.append(f)
            if len(calls) == k:
                raise PermissionError(errno.EACCES, "Permission denied")
            return real_save(obj, f, *args, **kwargs)

        monkeypatch.setattr(torch, "save", failing_save)
        with pytest.raises(CheckpointWriteError) as info:
            manager.save(2, roles, hf_policy=roles["actor"])
        monkeypatch.setattr(torch, "save", real_save)
        assert info.value.errno == errno.EACCES
        assert f"writing {calls[k - 1].name} failed: EACCES (Permission denied)" in str(info.value)
        assert manager.steps() == [1] and not list(tmp_path.glob(".tmp-*"))
        assert manager.find_latest() == (1, [])
