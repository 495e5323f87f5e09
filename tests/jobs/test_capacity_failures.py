"""Each way the capacity scaler can fail, alone: the real HyperPodScaler over the fake HyperPod of hyperpod_fake
(requests and replies checked against botocore's model), the claims on a temp folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import botocore.loaders
import pytest
from hyperpod_fake import FakeSageMaker, FakeSlurm

from llm_pipeline.errors import StepError
from llm_pipeline.jobs import capacity, capacity_chain
from llm_pipeline.jobs.chain import SubmitError
from llm_pipeline.jobs.run_facts import RunFacts
from llm_pipeline.run_files import StepJob

REPO = Path(__file__).resolve().parents[2]
GROUP = capacity.Group(name="gpu", partition="g5", floor=0, ceiling=4)


class World:
    def __init__(self, path: Path, running: int = 0) -> None:
        self.path = path
        self.slurm = FakeSlurm()
        self.sagemaker = FakeSageMaker(cluster="c", group=GROUP.name, slurm=self.slurm)
        self.sagemaker.start(running)
        self.scaler = capacity.HyperPodScaler("c", self.sagemaker)
        self.slept: list[float] = []

    def claim(self, nodes: int) -> str:
        return capacity.claim(GROUP, nodes, self.scaler, self.path, alive=self.slurm.alive)

    def release(self, claim_id: str, tries: int = capacity.RELEASE_TRIES) -> list[str]:
        return capacity.release(
            GROUP, claim_id, self.scaler, self.path, busy=self.slurm.busy, drain=self.slurm.drain,
            resume=self.slurm.resume, alive=self.slurm.alive, sleep=self.slept.append, tries=tries,
        )  # fmt: skip

    def claims(self) -> capacity.Claims:
        return capacity.read_claims(self.path)

    def hosts(self, status: str = "Running") -> list[str]:
        return [n.host for n in self.sagemaker.nodes.values() if n.status == status]


@pytest.fixture
def world(tmp_path) -> World:
    return World(tmp_path / "gpu.json")


def test_a_refused_add_fails_the_claim_at_once_naming_the_group_and_the_error(world):
    world.sagemaker.plan("BatchAddClusterNodes", "IncompatibleInstanceTypes")
    with pytest.raises(StepError, match=r"refused to add nodes to group gpu of cluster c: IncompatibleInstanceTypes"):
        world.claim(2)
    assert world.claims().claims == {}  # no claim left to wait an hour for
    assert world.sagemaker.nodes == {}


def test_a_throttled_add_fails_the_claim_naming_the_call(world):
    world.sagemaker.plan("BatchAddClusterNodes", "throttle")
    with pytest.raises(StepError, match=r"BatchAddClusterNodes for group gpu of cluster c failed: ThrottlingException"):
        world.claim(1)
    assert world.claims().claims == {}


def test_a_refused_delete_is_not_booked_as_removed_and_the_claim_stays_until_a_later_release_succeeds(world):
    mine = world.claim(2)
    world.sagemaker.tick()
    (kept, gone) = world.hosts()
    world.sagemaker.by_host(kept).refuse_delete = "NodeIdInUse"
    with pytest.raises(StepError, match=rf"group gpu: could not give back .* {kept}: NodeIdInUse"):
        world.release(mine)
    assert world.hosts("ShuttingDown") == [gone] and kept not in world.sagemaker.deleted
    assert world.slurm.drained == {gone}  # the refused node is resumed: it stays in service
    left = world.claims()
    assert left.claims[mine].released and "NodeIdInUse" in left.claims[mine].error
    assert any(kept in problem and "delete refused" in problem for problem in left.problems)
    assert world.slept == [capacity.RELEASE_BACKOFF_S * 3**k for k in range(capacity.RELEASE_TRIES - 1)]
    world.sagemaker.by_host(kept).refuse_delete = ""
    assert world.release("") == [kept]  # the next release (here a sweep) finishes it and drops the claim
    assert world.claims().claims == {} and world.claims().problems == []


def test_a_throttled_delete_is_tried_again_after_a_backoff(world):
    mine = world.claim(1)
    world.sagemaker.tick()
    world.sagemaker.plan("BatchDeleteClusterNodes", "throttle")
    assert world.release(mine) == world.hosts("ShuttingDown")
    assert world.slept == [capacity.RELEASE_BACKOFF_S] and world.claims().claims == {}


def test_a_denied_delete_keeps_the_claim_and_resumes_the_drained_nodes(world):
    mine = world.claim(2)
    world.sagemaker.tick()
    for _ in range(capacity.RELEASE_TRIES):
        world.sagemaker.plan("BatchDeleteClusterNodes", "deny")
    with pytest.raises(StepError, match="BatchDeleteClusterNodes for group gpu of cluster c failed: AccessDenied"):
        world.release(mine)
    assert world.slurm.drained == set() and len(world.hosts()) == 2  # nothing left drained and billed unseen
    assert "AccessDeniedException" in world.claims().claims[mine].error


def test_a_node_that_got_a_job_while_being_drained_is_resumed_and_kept(world):
    mine = world.claim(2)
    world.sagemaker.tick()
    (late, idle) = world.hosts()
    world.slurm.land_on_drain[late] = "other-users-job"
    assert world.release(mine) == [idle]
    assert world.slurm.drained == {idle} and late in world.hosts()


def test_a_refused_drain_removes_nothing_and_is_named(world):
    mine = world.claim(1)
    world.sagemaker.tick()

    def refused(nodes):
        raise StepError(f"Slurm refused to drain {', '.join(nodes)} (Invalid user id)")

    with pytest.raises(StepError, match="Slurm refused to drain ip-10-1-0-1"):
        capacity.release(
            GROUP, mine, world.scaler, world.path, busy=world.slurm.busy, drain=refused, resume=world.slurm.resume,
            alive=world.slurm.alive, sleep=world.slept.append, tries=1,
        )  # fmt: skip
    assert world.sagemaker.deleted == [] and "Slurm refused to drain" in world.claims().claims[mine].error


def test_every_instance_status_in_botocores_model_is_counted_for_what_it_is():
    model = botocore.loaders.create_loader().load_service_model("sagemaker", "service-2")
    assert sorted(capacity.INSTANCE_STATUSES) == sorted(model["shapes"]["ClusterInstanceStatus"]["enum"])


@pytest.mark.parametrize("status", ["Pending", "DeepHealthCheckInProgress", "SystemUpdating", "AttachInProgress"])
def test_nodes_coming_up_or_updating_count_so_a_second_chain_adds_nothing_past_count(world, status):
    world.claim(3)
    for node in world.sagemaker.nodes.values():
        node.status = status
    world.claim(3)  # the sum is 6, the group's count 4: one more, not three
    assert len(world.sagemaker.nodes) == GROUP.ceiling


def test_a_claim_expires_when_its_chains_jobs_are_gone_or_none_came(world):
    lost = capacity.claim(GROUP, 1, world.scaler, world.path, alive=world.slurm.alive, clock=lambda: 0.0)
    ran = world.claim(1)
    job = world.slurm.new_job()
    capacity.record_jobs(world.path, ran, [job])
    world.slurm.end(job)  # the chain ended and its release job never ran
    world.claim(1)  # any later claim sees both expired
    claims = world.claims().claims
    assert claims[lost].released and "no job was recorded" in claims[lost].error
    assert claims[ran].released and f"its jobs ({job}) are gone" in claims[ran].error


def test_a_refused_release_sbatch_leaves_the_chains_jobs_on_the_claim_and_names_it(world, tmp_path, monkeypatch):
    env = {**capacity.scaling_environment({"scale_with_runs": 1, "group": "gpu", "min_instance_count": 0,
                                           "count": 4}), capacity.CLAIMS_DIR_VARIABLE: str(tmp_path)}  # fmt: skip
    mine = world.claim(1)
    refusal = subprocess.CompletedProcess([], 1, "", "sbatch: error: QOSMaxSubmitJobPerUserLimit")
    monkeypatch.setattr(capacity_chain, "slurm", lambda argv: refusal)
    facts = RunFacts(config=tmp_path / "run.toml", output_dir=tmp_path / "run", nodes=1)
    chain = [StepJob(step="train", job="41", log="train.log"), StepJob(step="evaluate", job="42", log="e.log")]
    with pytest.raises(SubmitError, match=rf"refused the capacity release job: .*QOSMax.*claim {mine} expires"):
        capacity_chain.submit_release(facts, mine, chain, env)
    assert world.claims().claims[mine].jobs == ["41", "42"]


def test_claims_live_in_their_file_and_survive_a_restart(world):
    """A claim made here is released by a fresh interpreter (the controller rebooted in between); a claims file
    written before claims carried jobs still reads."""
    mine = world.claim(1)
    script = (
        "import json, sys\nfrom llm_pipeline.jobs import capacity\n"
        f"claims = capacity.read_claims(capacity.Path({str(world.path)!r}))\n"
        "print(json.dumps({k: c.nodes for k, c in claims.claims.items()}))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO / "payloads")})  # fmt: skip
    assert json.loads(out.stdout) == {mine: 1}
    world.path.write_text(json.dumps({"claims": {"old": 2}}))
    assert capacity.read_claims(world.path).live() == {"old": 2}
