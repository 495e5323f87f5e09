"""A chain on a group that scales with runs, under a real local Slurm with the node scaler of tools/local_slurm.py
(nodes added by resuming them, removed by draining them): nodes are claimed before the first step and given
back after the last, whether the chain succeeds, fails at a step, or is cancelled; two chains share the group
and neither's release removes a node the other runs on; a node that never comes up is the chain's first failed
step (wait-capacity), and its claim is given back.

The chains that run steps start at data (the module's inputs hold the model): a claim wraps whatever chain is
submitted, so prepare and download would add two jobs and prove nothing more here. For the same reason the chain
that succeeds stops after train (`submit --to train`): its release follows the last step submitted.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from slurm_helpers import REPO, submit, wait_for

from llm_pipeline.jobs.run_config_text import write_derived
from tests.needs_root import require_root
from tools.local_slurm import SlurmNodeScaler
from tools.rehearse import fsx_environment, write_inputs

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm-capacity")]
TINY = REPO / "payloads" / "configs" / "tiny-cpu.toml"


@pytest.fixture(scope="module")
def cluster(two_nodes, tmp_path_factory):
    root = tmp_path_factory.mktemp("capacity")
    env = two_nodes.env(fsx_environment(root / "fsx"))
    write_inputs(TINY, env, records=60)
    env.update(
        HPL_SCALE_WITH_RUNS="1",
        HPL_SCALE_GROUP="compute",
        HPL_SCALE_FLOOR="0",
        HPL_SCALE_CEILING="2",
        HPL_SCALER="tools.local_slurm:SlurmNodeScaler",
        HPL_SCALER_PARTITION=two_nodes.name,  # the group: this module's partition of the shared cluster
        HPL_CAPACITY_WAIT_S="60",  # a node missing for a minute fails wait-capacity (the default is an hour)
        HPL_CAPACITY_DIR=str(root / "capacity"),
        PYTHONPATH=f"{REPO}:{REPO / 'payloads'}",
    )
    return env, root


@pytest.fixture
def scaled(cluster, tmp_path):
    """Every node out of service (the group at its floor, 0) and a fresh log of the scaler's calls."""
    env, root = cluster
    env = {**env, "HPL_SCALER_LOG": str(tmp_path / "scaler.jsonl")}
    wait_for(lambda: queue_is_empty(env), 120, "an empty queue")
    nodes = ",".join(states(env))
    subprocess.run(["scontrol", "update", f"nodename={nodes}", "state=drain", "reason=floor"], env=env, check=True)
    return env, root, tmp_path / "scaler.jsonl"


def states(env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env, capture_output=True, text=True, check=True)
    words = out.stdout.split()
    return dict(zip(words[0::2], words[1::2], strict=True))


def in_service(env: dict[str, str]) -> list[str]:
    return sorted(n for n, s in states(env).items() if not s.startswith(SlurmNodeScaler.OUT_OF_SERVICE))


def queue_is_empty(env: dict[str, str]) -> bool:
    out = subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip() == ""


def calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def variant(root: Path, name: str, **keys: object) -> Path:
    values = {tuple(key.split("__")): value for key, value in keys.items()}
    return write_derived(TINY, root / f"{name}.toml", values, run_dir=f"${{HPL_OUTPUTS_DIR}}/{name}")


def released(env: dict[str, str], log: Path) -> list[dict]:
    """Wait for the release job to end; the scaler's removals."""
    wait_for(lambda: queue_is_empty(env), 600, "the chain and its release job")
    return [call for call in calls(log) if call["action"] == "remove"]


def assert_removed_only_idle(removals: list[dict]) -> None:
    """Each removed node ran nothing but the release job itself when it was removed."""
    for call in removals:
        for node, jobs in call["running"].items():
            assert all(job.endswith("hpl-release-capacity") for job in jobs), (node, jobs)


def test_a_chain_claims_its_node_before_train_and_gives_it_back_after_its_last_step(scaled):
    env, root, log = scaled
    config = variant(root, "ok", train__max_steps=2, train__save_steps=2)
    result = submit(env, config, "--from", "data", "--to", "train", "--no-smoke")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "capacity: claimed 1 node(s) of group compute" in result.stdout
    (added,) = [call for call in calls(log) if call["action"] == "add"]
    assert len(added["nodes"]) == 1
    removals = released(env, log)
    out_dir = Path(env["HPL_OUTPUTS_DIR"]) / "ok"
    last_done = (out_dir / "logs" / "state" / "train.json").stat().st_mtime
    train_log = next((out_dir / "logs").glob("train-*.log")).stat().st_ctime
    assert added["t"] < train_log  # claimed before the chain's jobs ran
    assert [call["nodes"] for call in removals] == [added["nodes"]] and removals[0]["t"] >= last_done
    assert json.loads((out_dir / "logs" / "state" / "train.json").read_text())["state"] == "COMPLETED"
    assert not list((out_dir / "logs").glob("consolidate-*.log"))  # --to train: nothing after it was submitted
    assert_removed_only_idle(removals)
    assert in_service(env) == []  # back to the floor


def test_two_chains_share_the_group_a_failed_and_a_cancelled_one_and_no_busy_node_is_removed(scaled):
    """A chain failing at its data step and one cancelled at once claim a node each; the cancelled one's release
    finds the other's node busy (or both idle) and removes only idle ones; both nodes are back in the end."""
    env, root, log = scaled
    broken = variant(root, "broken", data__dataset="${HPL_DATASETS_DIR}/missing.jsonl")
    cancelled = variant(root, "cancelled")
    first = submit(env, broken, "--from", "data", "--no-smoke")
    assert first.returncode == 0, first.stdout + first.stderr
    second = submit(env, cancelled, "--no-smoke")
    assert second.returncode == 0, second.stdout + second.stderr
    assert len([call for call in calls(log) if call["action"] == "add"]) == 2  # one node per claim
    head = second.stdout.split("submitted wait-capacity job ")[1].split()[0]
    subprocess.run(["scancel", head], env=env, check=True)  # the rest go with it (afterok, kill_invalid_depend)
    removals = released(env, log)
    assert sorted(node for call in removals for node in call["nodes"]) == sorted(states(env))
    assert_removed_only_idle(removals)
    assert in_service(env) == []
    data_state = json.loads((Path(env["HPL_OUTPUTS_DIR"]) / "broken" / "logs" / "state" / "data.json").read_text())
    assert data_state["state"] == "FAILED"


def test_a_node_that_never_comes_up_is_the_chains_first_failed_step_and_the_claim_goes_back(scaled):
    env, root, log = scaled
    env = {**env, "HPL_SCALER": "tools.local_slurm:ShortSlurmNodeScaler", "HPL_CAPACITY_WAIT_S": "5"}
    config = variant(root, "short", parallel__nodes=2)
    result = submit(env, config, "--no-smoke")
    assert result.returncode == 0, result.stdout + result.stderr
    removals = released(env, log)
    logs = Path(env["HPL_OUTPUTS_DIR"]) / "short" / "logs"
    (wait_log,) = logs.glob("wait-capacity-*.log")
    assert "group compute: 1 of the 2 node(s) this chain claimed did not come up in 5 s" in wait_log.read_text()
    assert json.loads((logs / "state" / "wait-capacity.json").read_text())["state"] == "FAILED"
    assert not list(logs.glob("prepare-*.log"))  # nothing after it ran
    assert len(removals) == 1 and in_service(env) == []


def test_a_team_user_cannot_drain_and_the_release_says_so_removing_nothing(cluster, tmp_path):
    """On HyperPod a team user's release job is no Slurm operator: `scontrol update` is refused. The drain is
    checked, so the release removes nothing undrained and names the refusal and the admin's way out."""
    require_root("a release as a team user")
    env, _ = cluster
    user, uid = "hplscaler", 46640
    # The user reads the cluster's slurm.conf from a folder of their own reach (pytest's tmp is root's only): without
    # it scontrol retried the unreadable file for a minute and never asked slurmctld, which must be what refuses.
    readable = Path(tempfile.mkdtemp(prefix="hpl-conf-"))
    readable.chmod(0o755)
    conf = Path(shutil.copy(env["SLURM_CONF"], readable / "slurm.conf"))
    conf.chmod(0o644)
    subprocess.run(["useradd", "--uid", str(uid), "--no-create-home", user], check=True)
    try:
        node = sorted(states(env))[0]
        before = states(env)[node]
        script = (
            "from llm_pipeline.errors import StepError\nfrom llm_pipeline.jobs import capacity\n"
            f"try:\n    capacity.slurm_drain([{node!r}])\nexcept StepError as error:\n    print(error)\n"
        )
        done = subprocess.run(
            ["runuser", "-u", user, "--", "/usr/bin/python3", "-c", script],
            env={**env, "SLURM_CONF": str(conf), "PYTHONPATH": str(REPO / "payloads")},
            capture_output=True, text=True, cwd=tmp_path,
        )  # fmt: skip
        after = states(env)[node]
    finally:
        subprocess.run(["userdel", user], check=True)
        shutil.rmtree(readable)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    (line,) = done.stdout.splitlines() or [""]
    assert line.startswith(f"Slurm refused to drain {node} (") and "capacity sweep --partition" in line, line
    # slurmctld itself refused the team user's update (not a client that could not read the conf)
    assert "slurm_update error: Invalid user id" in line, line
    controller_log = (Path(env["SLURM_CONF"]).parent / "log" / "slurmctld.log").read_text()
    assert f"Security violation, UPDATE_NODE RPC from uid={uid}" in controller_log
    assert after == before  # nothing changed in Slurm
