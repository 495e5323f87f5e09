"""Capacity that follows the pipeline (llm_pipeline.jobs.capacity): claims, releases, and HyperPod's node APIs.

The claims and the idle rule run for real on a temp folder; the scaler here is an in-memory group of nodes with
jobs on some of them, and HyperPodScaler's requests go to a botocore Stubber, which checks each one against the
installed SageMaker model (BatchAddClusterNodes, BatchDeleteClusterNodes, ListClusterNodes).
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_pipeline.errors import StepError
from llm_pipeline.jobs import capacity
from llm_pipeline.jobs.chain import job_environment
from llm_pipeline.jobs.run_facts import RunFacts
from tests.needs_root import require_root

REPO = Path(__file__).resolve().parents[2]

GROUP = capacity.Group(name="gpu", partition="g5", floor=1, ceiling=4)


class Nodes:
    """A group of nodes: which are in service, and the jobs each runs."""

    def __init__(self, up: int, total: int = 8) -> None:
        self.all = [f"n{i}" for i in range(total)]
        self.up = self.all[:up]
        self.jobs: dict[str, set[str]] = {}
        self.removed_busy: list[str] = []
        self.drained: set[str] = set()

    def in_service(self, group: str) -> list[str]:
        return list(self.up)

    def held(self, group: str) -> int:
        return len(self.up)

    def add(self, group: str, count: int) -> None:
        spare = [n for n in self.all if n not in self.up]
        for node in spare[:count]:
            self.up.append(node)
            self.drained.discard(node)

    def remove(self, group: str, nodes) -> dict[str, str]:
        for node in nodes:
            if self.jobs.get(node):
                self.removed_busy.append(node)
            self.up.remove(node)
        return {}

    def busy(self, node: str, ignore_own: bool = False) -> bool:
        return bool(self.jobs.get(node))

    def drain(self, nodes) -> None:
        self.drained.update(nodes)

    def resume(self, nodes) -> None:
        self.drained.difference_update(nodes)


def no_jobs(jobs) -> set[str]:
    return set()


def release(nodes: Nodes, claim_id: str, path) -> list[str]:
    return capacity.release(GROUP, claim_id, nodes, path, busy=nodes.busy, drain=nodes.drain, resume=nodes.resume)


def test_a_claim_adds_what_the_live_claims_need_and_a_release_gives_it_back(tmp_path):
    path, nodes = tmp_path / "gpu.json", Nodes(up=1)
    first = capacity.claim(GROUP, 2, nodes, path)
    assert len(nodes.up) == 2  # the floor's node and one more
    second = capacity.claim(GROUP, 2, nodes, path)
    assert len(nodes.up) == 4  # two chains: their sum
    assert release(nodes, first, path) == ["n0", "n1"]  # idle ones, in order
    assert len(nodes.up) == 2
    release(nodes, second, path)
    assert len(nodes.up) == 1  # down to the floor
    assert capacity.read_claims(path).claims == {}


def test_claims_beyond_the_ceiling_are_capped_and_a_chain_larger_than_it_refused(tmp_path):
    path, nodes = tmp_path / "gpu.json", Nodes(up=0)
    capacity.claim(GROUP, 3, nodes, path)
    capacity.claim(GROUP, 3, nodes, path)
    assert len(nodes.up) == 4
    with pytest.raises(StepError, match="needs 5 nodes and group gpu scales to at most 4"):
        capacity.claim(GROUP, 5, nodes, path)


def test_a_busy_node_is_never_given_back(tmp_path):
    path, nodes = tmp_path / "gpu.json", Nodes(up=1)
    mine = capacity.claim(GROUP, 3, nodes, path)
    nodes.jobs = {"n1": {"other"}, "n2": {"other"}}  # another user's jobs landed on two of them
    gone = release(nodes, mine, path)
    assert gone == ["n0"] and nodes.removed_busy == []
    assert set(nodes.up) == {"n1", "n2"}  # above the floor until their jobs end: never killed


def test_the_release_jobs_own_node_goes_last_and_counts_as_idle(tmp_path):
    path, nodes = tmp_path / "gpu.json", Nodes(up=0)
    mine = capacity.claim(GROUP, 2, nodes, path)

    def busy(node: str, ignore_own: bool = False) -> bool:
        return node == "n0" and not ignore_own  # n0 runs only the release job

    gone = capacity.release(
        capacity.Group("gpu", "g5", 0, 4),
        mine,
        nodes,
        path,
        busy=busy,
        drain=nodes.drain,
        resume=nodes.resume,
        own_node="n0",
    )
    assert gone == ["n1", "n0"] and nodes.up == []


def test_the_lock_serializes_claims(tmp_path):
    path, nodes = tmp_path / "gpu.json", Nodes(up=0, total=64)
    group = capacity.Group("gpu", "g5", 0, 64)
    threads = [threading.Thread(target=capacity.claim, args=(group, 1, nodes, path)) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(capacity.read_claims(path).claims) == 16 and len(nodes.up) == 16


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["claim", "release", "job", "done"]), st.integers(1, 3)), max_size=30))
def test_any_interleaving_keeps_floor_and_claims_and_never_removes_a_busy_node(tmp_path_factory, steps):
    """Claims and releases of several chains, with jobs starting and ending on nodes in between."""
    path, nodes = tmp_path_factory.mktemp("claims") / "gpu.json", Nodes(up=GROUP.floor)
    live: list[str] = []
    for action, size in steps:
        if action == "claim":
            live.append(capacity.claim(GROUP, size, nodes, path))
        elif action == "release" and live:
            release(nodes, live.pop(0), path)
        elif action == "job" and nodes.up:
            nodes.jobs.setdefault(nodes.up[size % len(nodes.up)], set()).add(f"job{len(nodes.jobs)}")
        elif action == "done":
            nodes.jobs.pop(next(iter(nodes.jobs), ""), None)
        claims = capacity.read_claims(path).live()
        assert len(nodes.up) >= GROUP.wanted(claims) or not claims  # claims are served (added at claim time)
        assert len(nodes.up) >= GROUP.floor
        assert nodes.removed_busy == []
    for claim_id in live:
        release(nodes, claim_id, path)
    busy = {node for node, jobs in nodes.jobs.items() if jobs and node in nodes.up}
    assert len(nodes.up) >= max(GROUP.floor, len(busy))  # no claim left: a node running a job stays
    assert capacity.read_claims(path).claims == {}
    # A node busy at its release (a job outside any claim) goes back at the next release once idle.
    nodes.jobs.clear()
    release(nodes, "a-later-chain", path)
    assert len(nodes.up) == GROUP.floor


# -- HyperPod's node APIs, each request checked against botocore's model by the Stubber ---------------------------
CLUSTER = "hyperpod-lora-cluster"


def node_summary(index: int, group: str = "gpu", status: str = "Running") -> dict:
    return {
        "InstanceGroupName": group,
        "InstanceId": f"i-0{index:016d}",
        "InstanceType": "ml.g5.12xlarge",
        "LaunchTime": datetime.datetime(2026, 1, 1),
        "InstanceStatus": {"Status": status},
        "PrivateDnsHostname": f"ip-10-1-0-{index}.us-west-2.compute.internal",
    }


@pytest.fixture
def sagemaker():
    client = boto3.client("sagemaker", region_name="us-west-2", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


def test_hyperpod_scaler_adds_by_target_count_in_steps_the_model_allows(sagemaker):
    client, stubber = sagemaker
    for step in (50, 20):
        stubber.add_response(
            "batch_add_cluster_nodes",
            {"Successful": [], "Failed": []},
            {"ClusterName": CLUSTER, "NodesToAdd": [{"InstanceGroupName": "gpu", "IncrementTargetCountBy": step}]},
        )
    capacity.HyperPodScaler(CLUSTER, client).add("gpu", 70)


def test_hyperpod_scaler_lists_and_deletes_by_instance_id(sagemaker):
    client, stubber = sagemaker
    listing = {"ClusterNodeSummaries": [node_summary(1), node_summary(2), node_summary(3, status="ShuttingDown")]}
    request = {"ClusterName": CLUSTER, "InstanceGroupNameContains": "gpu"}
    stubber.add_response("list_cluster_nodes", listing, request)
    scaler = capacity.HyperPodScaler(CLUSTER, client)
    assert scaler.in_service("gpu") == ["ip-10-1-0-1", "ip-10-1-0-2"]
    stubber.add_response("list_cluster_nodes", listing, request)
    stubber.add_response(
        "batch_delete_cluster_nodes",
        {"Successful": [node_summary(2)["InstanceId"]]},
        {"ClusterName": CLUSTER, "NodeIds": [node_summary(2)["InstanceId"]]},
    )
    scaler.remove("gpu", ["ip-10-1-0-2"])


def test_the_add_step_is_the_models_largest_increment():
    """botocore validates an integer's minimum only, so the model's maximum is read here, not trusted to the Stubber."""
    model = botocore_model()
    spec = model["shapes"]["AddClusterNodeSpecificationIncrementTargetCountByInteger"]
    assert (spec["min"], spec["max"]) == (1, capacity.HyperPodScaler.MAX_ADD)


def botocore_model() -> dict:
    import botocore.loaders

    return botocore.loaders.create_loader().load_service_model("sagemaker", "service-2")


def test_the_ledger_adds_the_node_hours_held_at_each_count_against_always_on():
    hour = 3600.0
    usage = capacity.account({}, nodes=3, ceiling=4, now=0.0)  # a chain claims: 3 nodes from 0 h
    usage = capacity.account(usage, nodes=1, ceiling=4, now=hour)  # its release: 1 node (the floor) from 1 h
    held, always_on = capacity.node_hours(usage, now=2 * hour)
    assert (held, always_on) == (3 + 1, 4 * 2)


def test_claim_and_release_keep_the_ledger_beside_the_claims(tmp_path):
    nodes, path = Nodes(up=1), tmp_path / "gpu.json"
    claim_id = capacity.claim(GROUP, 3, nodes, path)
    assert json.loads(capacity.usage_path(path).read_text())["nodes"] == 3
    release(nodes, claim_id, path)
    usage = json.loads(capacity.usage_path(path).read_text())
    assert (usage["nodes"], usage["ceiling"]) == (GROUP.floor, GROUP.ceiling) and usage["node_seconds"] >= 0


def test_every_job_of_a_scaled_chain_carries_the_groups_scaling_facts(tmp_path):
    """The estimate step reads them to say whose node-hours it counts (llm_pipeline.jobs.estimate)."""
    facts = RunFacts(config=tmp_path / "run.toml", output_dir=tmp_path / "run", nodes=1)
    scaled = capacity.scaling_environment({"scale_with_runs": 1, "group": "gpu", "min_instance_count": 0, "count": 2})
    exported = job_environment(facts, scaled)
    assert {name: exported[name] for name in scaled} == scaled and capacity.group_from_env(exported) is not None


def test_the_wait_returns_once_the_nodes_are_up_and_fails_past_its_deadline_naming_what_is_missing():
    polls = iter([[], ["n0"], ["n0", "n1"]])
    assert capacity.wait_for_nodes(GROUP, 2, 60, ready=lambda partition: next(polls), poll_s=0) == ["n0", "n1"]
    with pytest.raises(StepError, match=r"group gpu: 1 of the 2 node\(s\) this chain claimed did not come up in 0 s"):
        capacity.wait_for_nodes(GROUP, 2, 0, ready=lambda partition: ["n0"], poll_s=0)


def test_a_claims_folder_the_user_cannot_write_is_one_line_naming_it(tmp_path_factory):
    """Claim and release as a user without write access to the claims folder (one another user made): a
    StepError naming the folder, which submit and the release job print as one line."""
    require_root("claiming as another user")
    folder = Path(tempfile.mkdtemp(prefix="hpl-claims-"))
    try:
        folder.chmod(0o755)  # root's, as a folder the first claimer made is theirs
        script = (
            "import sys\nfrom llm_pipeline.errors import StepError\nfrom llm_pipeline.jobs import capacity\n"
            f"path = capacity.Path({str(folder / 'gpu.json')!r})\n"
            "for attempt in (lambda: capacity.claim(capacity.Group('gpu', 'g5', 0, 4), 1, None, path),\n"
            "                lambda: capacity.release(capacity.Group('gpu', 'g5', 0, 4), 'c', None, path,\n"
            "                                         busy=None, drain=None, resume=None)):\n"
            "    try:\n        attempt()\n    except StepError as error:\n        print(error)\n"
        )
        done = subprocess.run(
            ["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", script],  # stdlib only; any user runs it
            env={**os.environ, "PYTHONPATH": str(REPO / "payloads")},
            capture_output=True,
            text=True,
        )
    finally:
        shutil.rmtree(folder)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all(
        line.startswith(f"cannot change the capacity claims in {folder} (") for line in lines
    )
    assert all("Permission denied" in line and "docs/teams.md" in line for line in lines), lines
