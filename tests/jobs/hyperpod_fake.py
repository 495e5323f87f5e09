"""A HyperPod group and its Slurm, in memory, for the capacity scaler's tests (no AWS, no Slurm: cheap enough for
hundreds of property-test examples).

``FakeSageMaker`` answers the three node calls HyperPodScaler makes. Every request and every reply is validated
against botocore's SageMaker model (the shapes a real call would send and get: ``Failed`` lists of
BatchAddClusterNodesError / BatchDeleteClusterNodesError, ``ClusterInstanceStatus`` values), and an AWS error is
botocore's own ClientError. Faults are planned ahead: the next call of an operation throttled or denied, the next
add refused, a node whose delete is refused. ``FakeSlurm`` holds the jobs on each node, the drained nodes and the
chains' job ids, and plays the capacity module's busy, drain, resume and alive hooks.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass, field

import botocore.session
from botocore.exceptions import ClientError
from botocore.validate import ParamValidator

MODEL = botocore.session.get_session().get_service_model("sagemaker")
VALIDATOR = ParamValidator()
PAGE = 2  # ListClusterNodes' page here: small, so every listing pages
ERRORS = {  # an AWS error per fault name: (code, message, HTTP status)
    "throttle": ("ThrottlingException", "Rate exceeded", 400),
    "deny": ("AccessDeniedException", "not authorized to perform: sagemaker:BatchDeleteClusterNodes", 403),
}


def checked(operation: str, direction: str, value: dict) -> dict:
    """``value`` when it matches the operation's input or output shape in botocore's model; else AssertionError."""
    model = MODEL.operation_model(operation)
    report = VALIDATOR.validate(value, model.input_shape if direction == "input" else model.output_shape)
    assert not report.has_errors(), f"{operation} {direction}: {report.generate_report()}"
    return value


@dataclass
class Node:
    instance: str
    host: str
    status: str = "Pending"
    refuse_delete: str = ""  # a BatchDeleteClusterNodesErrorCode HyperPod answers for this node


@dataclass
class FakeSageMaker:
    cluster: str
    group: str
    nodes: dict[str, Node] = field(default_factory=dict)
    faults: dict[str, list[str]] = field(default_factory=dict)  # operation -> planned faults, first next
    slurm: FakeSlurm | None = None
    removed_busy: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)  # Slurm names HyperPod accepted to delete
    serial: int = 0

    def start(self, count: int) -> None:
        """``count`` nodes running from the outset (the group's floor)."""
        for _ in range(count):
            self._new("Running")

    def _new(self, status: str) -> Node:
        self.serial += 1
        node = Node(instance=f"i-{self.serial:017x}", host=f"ip-10-1-0-{self.serial}", status=status)
        self.nodes[node.instance] = node
        return node

    def plan(self, operation: str, fault: str) -> None:
        self.faults.setdefault(operation, []).append(fault)

    def _fault(self, operation: str) -> str:
        planned = self.faults.get(operation, [])
        fault = planned.pop(0) if planned else ""
        if fault in ERRORS:
            code, message, status = ERRORS[fault]
            raise ClientError(
                {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}, operation
            )
        return fault

    def list_cluster_nodes(self, **request) -> dict:
        checked("ListClusterNodes", "input", request)
        self._fault("ListClusterNodes")
        mine = [n for n in self.nodes.values() if request["InstanceGroupNameContains"] in self.group]
        start = int(request.get("NextToken", "0"))
        page = [
            {
                "InstanceGroupName": self.group,
                "InstanceId": node.instance,
                "InstanceType": "ml.g5.12xlarge",
                "LaunchTime": datetime.datetime(2026, 1, 1),
                "InstanceStatus": {"Status": node.status},
                "PrivateDnsHostname": f"{node.host}.us-west-2.compute.internal",
            }
            for node in mine[start : start + PAGE]
        ]
        reply = {"ClusterNodeSummaries": page}
        if start + PAGE < len(mine):
            reply["NextToken"] = str(start + PAGE)
        return checked("ListClusterNodes", "output", reply)

    def batch_add_cluster_nodes(self, **request) -> dict:
        checked("BatchAddClusterNodes", "input", request)
        fault = self._fault("BatchAddClusterNodes")
        (spec,) = request["NodesToAdd"]
        count = spec["IncrementTargetCountBy"]
        if fault:
            failed = {"InstanceGroupName": spec["InstanceGroupName"], "ErrorCode": fault, "FailedCount": count}
            return checked(
                "BatchAddClusterNodes", "output", {"Successful": [], "Failed": [{**failed, "Message": "no"}]}
            )
        added = [self._new("Pending") for _ in range(count)]
        successful = [
            {"NodeLogicalId": node.instance, "InstanceGroupName": self.group, "Status": "Pending"} for node in added
        ]
        return checked("BatchAddClusterNodes", "output", {"Successful": successful, "Failed": []})

    def batch_delete_cluster_nodes(self, **request) -> dict:
        checked("BatchDeleteClusterNodes", "input", request)
        self._fault("BatchDeleteClusterNodes")
        successful, failed = [], []
        for instance in request["NodeIds"]:
            node = self.nodes.get(instance)
            if node is None or node.refuse_delete:
                code = node.refuse_delete if node else "NodeIdNotFound"
                failed.append({"Code": code, "Message": f"{code} for {instance}", "NodeId": instance})
                continue
            if self.slurm and self.slurm.jobs.get(node.host):
                self.removed_busy.append(node.host)
            node.status = "ShuttingDown"
            self.deleted.append(node.host)
            successful.append(instance)
        reply = {"Successful": successful, "Failed": failed}
        # both lists hold at least one entry in the model: an empty one is left out of the reply
        return checked("BatchDeleteClusterNodes", "output", {key: value for key, value in reply.items() if value})

    def tick(self) -> None:
        """Provisioning moves on: coming nodes run (and join Slurm), leaving ones are gone."""
        for key, node in list(self.nodes.items()):
            if node.status in ("Pending", "AttachInProgress", "DeepHealthCheckInProgress", "SystemUpdating"):
                node.status = "Running"
            elif node.status in ("ShuttingDown", "DetachInProgress"):
                del self.nodes[key]

    def by_host(self, host: str) -> Node:
        return next(node for node in self.nodes.values() if node.host == host)


@dataclass
class FakeSlurm:
    jobs: dict[str, set[str]] = field(default_factory=dict)  # node -> job ids running there
    drained: set[str] = field(default_factory=set)
    alive_jobs: set[str] = field(default_factory=set)
    land_on_drain: dict[str, str] = field(default_factory=dict)  # node -> a job that starts there just before drain
    serial: int = 0

    def new_job(self) -> str:
        self.serial += 1
        self.alive_jobs.add(str(self.serial))
        return str(self.serial)

    def busy(self, node: str, ignore_own: bool = False) -> bool:
        return bool(self.jobs.get(node))

    def drain(self, nodes: Sequence[str]) -> None:
        for node in nodes:
            if node in self.land_on_drain:
                self.jobs.setdefault(node, set()).add(self.land_on_drain.pop(node))
        self.drained.update(nodes)

    def resume(self, nodes: Sequence[str]) -> None:
        self.drained.difference_update(nodes)

    def alive(self, jobs: Sequence[str]) -> set[str]:
        return set(jobs) & self.alive_jobs

    def end(self, job: str) -> None:
        self.alive_jobs.discard(job)
        for running in self.jobs.values():
            running.discard(job)
