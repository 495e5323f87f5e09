"""What on_init_complete.sh does on each kind of node, and that a second run changes nothing."""

from __future__ import annotations

import datetime
import re
import subprocess

import pytest
from lifecycle_node import COMPUTE_IPS, CONTROLLER_IP, LOGIN_IP, USER_ID, FakeNode, expected_profile

# Each folder's mode without teams (the group is the default user's own; lifecycle/slurm_teams.py ensure_layout).
LAYOUT = {
    "outputs": 0o755,
    "outputs/logs": 0o755,
    "models": 0o2775,
    "neuron-cache": 0o2775,
    "images": 0o2775,
    "scratch": 0o2775,
    "capacity": 0o2775,
}
PROFILE = "etc/profile.d/hyperpod-lora.sh"
MOTD = "etc/update-motd.d/99-hyperpod-lora"


def profile_environment(node: FakeNode) -> dict[str, str]:
    """Source the written profile in a clean shell, the way a login shell or sbatch job does."""
    shell = subprocess.run(
        ["env", "-i", "bash", "-c", f"source {node.root / PROFILE} && env"], capture_output=True, text=True, check=True
    )
    return dict(line.split("=", 1) for line in shell.stdout.splitlines() if line.startswith("HPL_"))


def layout_changes(run) -> list[str]:
    """The folders the fsx-layout step set (owner, group, mode), as it logs them."""
    lines = [line.split("[fsx-layout] set ", 1)[1] for line in run.stdout.splitlines() if "[fsx-layout] set " in line]
    return [line for line in lines if "ACL" not in line]


def assert_common_setup(node: FakeNode, run, group: str = "") -> None:
    assert run.returncode == 0, run.stderr
    assert profile_environment(node) == expected_profile(group)
    for name, mode in LAYOUT.items():
        info = (node.fsx / name).stat()
        assert (info.st_uid, info.st_gid, info.st_mode & 0o7777) == (USER_ID, USER_ID, mode), name
    assert sorted(layout_changes(run)) == sorted(f"/fsx/{n} {USER_ID}:{USER_ID} {m:o}" for n, m in LAYOUT.items())
    assert run.called("mountpoint") == [f"mountpoint -q {node.fsx}"]


def test_controller_gets_layout_profile_and_motd(node: FakeNode) -> None:
    run = node.run(CONTROLLER_IP)

    assert_common_setup(node, run)
    assert "instance controller-1, group controller, role Controller" in run.stdout
    motd = subprocess.run(["sh", str(node.root / MOTD)], capture_output=True, text=True, check=True).stdout
    assert "cd /fsx/payloads && python3 -m llm_pipeline.submit --config /fsx/payloads/configs/default.toml" in motd
    assert "hpctl submit" in motd and "lora-test" in motd and "/fsx/outputs/<run>/" in motd
    assert not run.called("neuron-ls") and not run.called("enroot")


def test_every_line_is_the_tool_the_utc_time_and_the_step(node: FakeNode) -> None:
    """lifecycle/README.md's line format, the time in UTC whatever the node's zone (the log reads its clock itself)."""
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    run = node.run(CONTROLLER_IP, TZ="Asia/Tokyo")
    after = datetime.datetime.now(datetime.timezone.utc)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    pattern = re.compile(r"\[hyperpod-lora\] (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) \[[a-z-]+\] \S")
    assert lines and all(pattern.match(line) for line in lines), [line for line in lines if not pattern.match(line)]
    stamps = {datetime.datetime.fromisoformat(pattern.match(line)[1].replace("Z", "+00:00")) for line in lines}
    assert before <= min(stamps) and max(stamps) <= after, (before, stamps, after)


def test_login_node_gets_motd_naming_its_role(node: FakeNode) -> None:
    run = node.run(LOGIN_IP)

    assert_common_setup(node, run)
    assert "role Login" in run.stdout
    assert "(Login node)" in (node.root / MOTD).read_text()
    assert not run.called("neuron-ls")


def test_compute_checks_neuron_and_unrestricts_enroot_dev(compute_node: FakeNode) -> None:
    run = compute_node.run(f"{COMPUTE_IPS[2]} 172.17.0.1")

    assert_common_setup(compute_node, run, "trn1")
    assert "instance trn1-3, group trn1, role Compute" in run.stdout
    assert "16 Neuron devices" in run.stdout and "neuron-ls: NEURON DEVICES: 16" in run.stdout
    assert run.called("neuron-ls") == ["neuron-ls "]
    enroot_conf = (compute_node.root / "etc/enroot/enroot.conf").read_text()
    assert enroot_conf == "ENROOT_RUNTIME_PATH /run/enroot/user-$(id -u)\nENROOT_RESTRICT_DEV no\n"
    assert not (compute_node.root / MOTD).exists()


def test_compute_without_neuron_ls_counts_devices(compute_node: FakeNode) -> None:
    compute_node.remove_recorder("neuron-ls")
    run = compute_node.run(COMPUTE_IPS[0])

    assert run.returncode == 0, run.stderr
    assert "16 Neuron devices" in run.stdout and "neuron-ls not installed" in run.stdout


def test_failing_neuron_ls_is_logged_and_provisioning_continues(compute_node: FakeNode) -> None:
    (compute_node.bin / "neuron-ls").write_text(
        '#!/usr/bin/env bash\necho "neuron-ls $*" >>"$RECORD_LOG"\n'
        'echo "error: no devices found by the runtime" >&2\nexit 5\n'
    )
    run = compute_node.run(COMPUTE_IPS[0])

    assert run.returncode == 0, run.stderr
    assert "neuron-ls: error: no devices found by the runtime" in run.stdout
    assert "neuron-ls failed (exit 5); continuing" in run.stdout
    assert "is ready" in run.stdout.splitlines()[-1]
    assert "[enroot-devices] begin" in run.stdout, "the steps after the check still ran"


@pytest.mark.parametrize("conf", ["", "ENROOT_RESTRICT_DEV no\n", "#ENROOT_RESTRICT_DEV yes\n"])
def test_enroot_conf_left_alone_when_it_does_not_restrict_dev(compute_node: FakeNode, conf: str) -> None:
    path = compute_node.write_enroot_conf(conf)
    before = path.stat().st_mtime_ns

    run = compute_node.run(COMPUTE_IPS[0])

    assert run.returncode == 0, run.stderr
    assert path.read_text() == conf and path.stat().st_mtime_ns == before
    assert "enroot does not restrict /dev" in run.stdout


def test_multi_node_compute_shares_one_fsx_layout(compute_node: FakeNode) -> None:
    first = compute_node.run(COMPUTE_IPS[0])
    assert first.returncode == 0, first.stderr
    others = []
    for index, ip in enumerate(COMPUTE_IPS[1:], start=2):
        other = FakeNode(compute_node.base.parent / f"node-{index}", fsx=compute_node.fsx)
        other.add_neuron_devices()
        others.append((other, other.run(ip), f"trn1-{index}"))

    for other, run, name in others:
        assert run.returncode == 0, run.stderr
        assert f"instance {name}, group trn1, role Compute" in run.stdout
        assert layout_changes(run) == []  # the first node made the layout
        assert profile_environment(other)["HPL_COMPUTE_GROUP"] == "trn1"


def test_existing_fsx_content_is_kept_and_ownership_fixed(node: FakeNode) -> None:
    outputs = node.fsx / "outputs"
    (outputs / "old-run").mkdir(parents=True)
    (outputs / "old-run" / "generation.txt").write_text("keep me")
    outputs.chmod(0o750)

    run = node.run(CONTROLLER_IP)

    assert run.returncode == 0, run.stderr
    assert (outputs / "old-run" / "generation.txt").read_text() == "keep me"
    assert (outputs / "old-run").stat().st_uid == 0  # only the top folder changes owner
    assert outputs.stat().st_uid == USER_ID and outputs.stat().st_mode & 0o7777 == LAYOUT["outputs"]


@pytest.mark.parametrize("ip", [CONTROLLER_IP, LOGIN_IP, COMPUTE_IPS[0]], ids=["controller", "login", "compute"])
def test_second_run_changes_nothing(compute_node: FakeNode, ip: str) -> None:
    first = compute_node.run(ip)
    assert first.returncode == 0, first.stderr
    before = compute_node.snapshot()

    second = compute_node.run(ip)

    assert second.returncode == 0, second.stderr
    assert compute_node.snapshot() == before
    assert layout_changes(second) == []
    assert "wrote:" not in second.stdout and "created" not in second.stdout


def test_changed_facts_rewrite_the_profile(node: FakeNode) -> None:
    assert node.run(CONTROLLER_IP).returncode == 0
    facts = node.scripts / "cluster-facts.json"
    facts.write_text(facts.read_text().replace("lora-test", "lora-two"))

    run = node.run(CONTROLLER_IP)

    assert run.returncode == 0, run.stderr
    assert "wrote: /etc/profile.d/hyperpod-lora.sh" in run.stdout
    assert profile_environment(node)["HPL_CLUSTER_NAME"] == "lora-two"


def test_node_address_override(node: FakeNode) -> None:
    run = node.run("192.168.9.9", LIFECYCLE_NODE_IPS=LOGIN_IP)

    assert run.returncode == 0, run.stderr
    assert "role Login" in run.stdout and "hostname -I" not in run.calls


def test_every_log_line_names_its_step(compute_node: FakeNode) -> None:
    run = compute_node.run(COMPUTE_IPS[0])

    steps = {line.split("[")[2].split("]")[0] for line in run.stdout.splitlines()}
    assert steps == {
        "start",
        "read-facts",
        "identify-node",
        "write-profile",
        "wait-fsx",
        "fsx-layout",
        "slurm-version",
        "teams",
        "neuron-devices",
        "enroot-devices",
        "efa-devices",
        "observability",
        "done",
    }


def test_started_with_sh_it_reruns_itself_with_bash(node: FakeNode) -> None:
    run = node.run(CONTROLLER_IP, shell="sh")

    assert run.returncode == 0, run.stderr
    assert "node controller-1 (Controller) is ready" in run.stdout
