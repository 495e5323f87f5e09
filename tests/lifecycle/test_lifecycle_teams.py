"""The teams step of on_init_complete.sh: users with fixed ids on every node; on the controller their
folders on FSx, the priority keys in slurm.conf and the teams' accounts in slurmdbd; a second run changes nothing."""

from __future__ import annotations

import json

import pytest
from lifecycle_node import COMPUTE_IPS, CONTROLLER_IP, USER_ID, FakeNode

from stacks.teams import users_file

SPEC = users_file(
    [{"name": "research", "gid": 3001, "fairshare": 3}, {"name": "product", "gid": 3002, "max_nodes": 2}],
    [
        {"name": "alice", "uid": 3101, "team": "research", "ssh_public_key": "ssh-ed25519 AAAAC3Nza alice@laptop"},
        {"name": "bob", "uid": 3201, "team": "product"},
    ],
)
# slurmctld as HyperPod runs it on the controller: accounting through its own slurmdbd.
SCONTROL = """if [[ "$*" == "show config" ]]; then
  echo "ClusterName             = lora-test"; echo "AccountingStorageType   = accounting_storage/slurmdbd"; exit 0
fi
echo "slurm 25.11.2"
"""


@pytest.fixture
def team_node(node: FakeNode) -> FakeNode:
    # root, and the default user HyperPod creates (the fake `id` answers USER_ID for it too).
    entries = {
        "passwd": f"root:x:0:0:root:/root:/bin/bash\nubuntu:x:{USER_ID}:{USER_ID}::/home/ubuntu:/bin/bash",
        "group": f"root:x:0:\nubuntu:x:{USER_ID}:",
        "shadow": "root:*::::::\nubuntu:*::::::",
        "gshadow": "root:*::\nubuntu:!::",
    }
    (node.root / "etc").mkdir(exist_ok=True)
    for name, text in entries.items():
        (node.root / "etc" / name).write_text(text + "\n")
    (node.scripts / "cluster-users.json").write_text(json.dumps(SPEC))
    for name, body in (("scontrol", SCONTROL), ("sacctmgr", "exit 0")):
        path = node.bin / name
        path.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >>"$RECORD_LOG"\n{body}\n')
        path.chmod(0o755)
    return node


def passwd(node: FakeNode) -> dict[str, list[str]]:
    return {line.split(":")[0]: line.split(":") for line in (node.root / "etc/passwd").read_text().splitlines()}


def test_the_controller_creates_users_folders_and_accounts(team_node: FakeNode) -> None:
    run = team_node.run(CONTROLLER_IP)
    assert run.returncode == 0, run.stderr
    users = passwd(team_node)
    assert users["alice"][2:4] == ["3101", "3001"] and users["bob"][2:4] == ["3201", "3002"]
    assert users["alice"][5] == "/fsx/home/alice", "homes on FSx, the same path on every node"
    for folder in ("home/alice", "outputs/alice"):
        info = (team_node.fsx / folder).stat()
        assert (info.st_uid, info.st_gid, oct(info.st_mode & 0o7777)) == (3101, 3001, "0o2750"), folder
    group = (team_node.root / "etc/group").read_text().splitlines()
    (shared,) = [line.split(":") for line in group if line.startswith("hplusers:")]
    assert shared[2] == "60000" and sorted(shared[3].split(",")) == ["alice", "bob", "ubuntu"], group
    for folder in ("models", "neuron-cache", "images", "scratch", "capacity"):
        info = (team_node.fsx / folder).stat()
        assert (info.st_uid, info.st_gid, oct(info.st_mode & 0o7777)) == (USER_ID, 60000, "0o2775"), folder
    keys = team_node.fsx / "home/alice/.ssh/authorized_keys"
    assert keys.read_text() == "ssh-ed25519 AAAAC3Nza alice@laptop\n" and keys.stat().st_mode & 0o777 == 0o600
    conf = (team_node.slurm_etc / "slurm.conf").read_text()
    assert "PriorityType=priority/multifactor" in conf
    assert "AccountingStorageEnforce=associations,limits,qos,safe" in conf
    assert run.called("systemctl") == ["systemctl restart slurmctld"]
    calls = run.called("sacctmgr")
    assert "sacctmgr -i modify account research set Fairshare=3 QOS=research-qos DefaultQOS=research-qos" in calls
    assert any(c.startswith("sacctmgr -i modify qos product-qos set") and "MaxTRESPerJob=node=2" in c for c in calls)
    assert "sacctmgr -i add user bob Account=product DefaultAccount=product Cluster=lora-test" in calls

    again = team_node.run(CONTROLLER_IP)
    assert again.returncode == 0, again.stderr
    assert again.called("systemctl") == [] and passwd(team_node) == users, "a second run changes nothing"


def test_a_compute_node_creates_the_same_ids_and_nothing_else(team_node: FakeNode) -> None:
    team_node.add_neuron_devices()
    team_node.add_efa_devices(8)
    run = team_node.run(COMPUTE_IPS[0])
    assert run.returncode == 0, run.stderr
    assert passwd(team_node)["bob"][2:4] == ["3201", "3002"]
    assert (team_node.fsx / "home/bob").stat().st_uid == 3201, "the layout is the same from any node (shared FSx)"
    assert run.called("sacctmgr") == [] and run.called("systemctl") == []


def test_a_user_whose_uid_differs_on_the_node_stops_provisioning(team_node: FakeNode) -> None:
    with (team_node.root / "etc/passwd").open("a") as handle:
        handle.write("alice:x:4000:4000::/home/alice:/bin/bash\n")
    run = team_node.run(COMPUTE_IPS[0])
    assert run.returncode != 0
    assert "user alice has uid 4000 on this node, the users file says 3101" in run.stderr
