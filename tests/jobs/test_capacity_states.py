"""The capacity scaler as a state machine: two or three chains claim and release one group through the real
HyperPodScaler over a fake HyperPod whose requests and replies are checked against botocore's model, while nodes
fail, calls are throttled or denied, adds and deletes are refused in part, jobs land on nodes being drained, and
chains die without their release. After every step: never past ``count``, never below what the live claims need,
never a busy node removed, and after every claim or release no live claim whose chain is gone.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hyperpod_fake import FakeSageMaker, FakeSlurm
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from llm_pipeline.errors import StepError
from llm_pipeline.jobs import capacity

GROUP = capacity.Group(name="gpu", partition="g5", floor=1, ceiling=4)
CHAINS = 3


class ScalerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="hpl-capacity-states-"))
        self.path = self.folder / "gpu.json"
        self.slurm = FakeSlurm()
        self.sagemaker = FakeSageMaker(cluster="c", group=GROUP.name, slurm=self.slurm)
        self.sagemaker.start(GROUP.floor)
        self.scaler = capacity.HyperPodScaler("c", self.sagemaker)
        self.chains: dict[int, tuple[str, list[str]]] = {}  # slot -> (claim, its jobs), while the chain lives
        self.now = 0.0

    def teardown(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    # -- what the group holds, as HyperPod counts it --------------------------------------------------------------
    def held(self) -> int:
        return sum(capacity.INSTANCE_STATUSES[n.status] == capacity.HELD for n in self.sagemaker.nodes.values())

    def live_claims(self) -> dict[str, int]:
        return capacity.read_claims(self.path).live()

    def no_claim_outlives_its_chain(self) -> None:
        mine = {claim_id for claim_id, _ in self.chains.values()}
        assert set(self.live_claims()) <= mine, (self.live_claims(), mine)

    def release(self, claim_id: str) -> None:
        try:
            removed = capacity.release(
                GROUP, claim_id, self.scaler, self.path, busy=self.slurm.busy, drain=self.slurm.drain,
                resume=self.slurm.resume, alive=self.slurm.alive, clock=lambda: self.now, sleep=lambda s: None,
                tries=2,
            )  # fmt: skip
        except StepError as error:
            assert f"group {GROUP.name}" in str(error)  # a planned fault outlasted the retries: named, claim kept
        else:
            assert set(removed) <= set(self.sagemaker.deleted)  # booked as removed: HyperPod's reply said so
        self.no_claim_outlives_its_chain()

    # -- chains -----------------------------------------------------------------------------------------------
    @rule(slot=st.integers(0, CHAINS - 1), nodes=st.integers(1, GROUP.ceiling), lost_before_jobs=st.booleans())
    def start_chain(self, slot: int, nodes: int, lost_before_jobs: bool) -> None:
        if slot in self.chains:
            return
        try:
            claim_id = capacity.claim(
                GROUP, nodes, self.scaler, self.path, alive=self.slurm.alive, clock=lambda: self.now
            )
        except StepError as error:
            assert f"group {GROUP.name}" in str(error) and len(self.live_claims()) == len(self.chains)
            return
        if lost_before_jobs:  # the submitting session died before its chain reached Slurm: nothing to wait for
            self.now += capacity.CLAIM_GRACE_S + 1
            return
        jobs = [self.slurm.new_job() for _ in range(3)]
        capacity.record_jobs(self.path, claim_id, jobs)
        self.chains[slot] = (claim_id, jobs)
        self.no_claim_outlives_its_chain()

    @rule(slot=st.integers(0, CHAINS - 1), with_release=st.booleans())
    def end_chain(self, slot: int, with_release: bool) -> None:
        if slot not in self.chains:
            return
        claim_id, jobs = self.chains.pop(slot)
        for job in jobs:
            self.slurm.end(job)
        if with_release:
            self.release(claim_id)
        # without: a refused release sbatch or a lost session; the next claim or release expires the claim

    @rule(slot=st.integers(0, CHAINS - 1), index=st.integers(0, 7))
    def chain_job_runs(self, slot: int, index: int) -> None:
        running = [n.host for n in self.sagemaker.nodes.values() if n.status == "Running"]
        if slot in self.chains and running:
            self.slurm.jobs.setdefault(running[index % len(running)], set()).add(self.chains[slot][1][0])

    @rule()
    def sweep(self) -> None:
        self.release("")

    # -- the world ----------------------------------------------------------------------------------------------
    @rule()
    def provisioning_moves_on(self) -> None:
        self.sagemaker.tick()

    @rule(index=st.integers(0, 7), status=st.sampled_from(sorted(capacity.INSTANCE_STATUSES)))
    def a_node_changes_status(self, index: int, status: str) -> None:
        """A node fails, is patched, runs its deep health check (HyperPod's doing, not ours)."""
        nodes = [n for n in self.sagemaker.nodes.values() if capacity.INSTANCE_STATUSES[n.status] == capacity.HELD]
        if nodes and capacity.INSTANCE_STATUSES[status] == capacity.HELD:
            nodes[index % len(nodes)].status = status

    @rule(index=st.integers(0, 7))
    def another_users_job_lands(self, index: int) -> None:
        running = [n.host for n in self.sagemaker.nodes.values() if n.status == "Running"]
        if running:
            self.slurm.jobs.setdefault(running[index % len(running)], set()).add(self.slurm.new_job())

    @rule(index=st.integers(0, 7))
    def a_job_lands_while_draining(self, index: int) -> None:
        running = [n.host for n in self.sagemaker.nodes.values() if n.status == "Running"]
        if running:
            self.slurm.land_on_drain[running[index % len(running)]] = self.slurm.new_job()

    @precondition(lambda self: any(self.slurm.jobs.values()))
    @rule()
    def a_job_ends(self) -> None:
        node = next(node for node, jobs in self.slurm.jobs.items() if jobs)
        job = sorted(self.slurm.jobs[node])[0]
        if not any(job in jobs for _, jobs in self.chains.values()):
            self.slurm.end(job)
        else:
            self.slurm.jobs[node].discard(job)  # one of the chain's steps ends; the chain goes on

    @rule(
        operation=st.sampled_from(["ListClusterNodes", "BatchAddClusterNodes", "BatchDeleteClusterNodes"]),
        fault=st.sampled_from(["throttle", "deny"]),
    )
    def an_aws_error(self, operation: str, fault: str) -> None:
        self.sagemaker.plan(operation, fault)

    @rule(code=st.sampled_from(["InvalidInstanceGroupStatus", "IncompatibleInstanceTypes"]))
    def an_add_refused(self, code: str) -> None:
        self.sagemaker.plan("BatchAddClusterNodes", code)

    @rule(index=st.integers(0, 7), code=st.sampled_from(["NodeIdInUse", "InvalidNodeStatus"]), lasting=st.booleans())
    def a_delete_refused(self, index: int, code: str, lasting: bool) -> None:
        nodes = list(self.sagemaker.nodes.values())
        if nodes:
            nodes[index % len(nodes)].refuse_delete = code if lasting else ""

    # -- what must always hold ------------------------------------------------------------------------------------
    @invariant()
    def never_past_count(self) -> None:
        assert self.held() <= max(GROUP.ceiling, GROUP.floor)

    @invariant()
    def never_below_a_live_claim(self) -> None:
        assert self.held() >= GROUP.wanted(self.live_claims())

    @invariant()
    def never_a_busy_node_removed(self) -> None:
        assert self.sagemaker.removed_busy == []

    @invariant()
    def no_node_left_drained(self) -> None:
        """A drained node still in the group was resumed (the fake's resume never fails, so none is reported)."""
        held = {n.host for n in self.sagemaker.nodes.values() if n.status == "Running"}
        assert not self.slurm.drained & held, self.slurm.drained & held


ScalerMachine.TestCase.settings = settings(max_examples=500, stateful_step_count=20, deadline=None)
test_scaler_states = ScalerMachine.TestCase
