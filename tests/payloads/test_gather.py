"""The gather step's transfer: a host's sealed part of a checkpoint reaches the first host over a real
socket and completes the checkpoint there; unsealed checkpoints (older runs) are left as they are."""

from __future__ import annotations

import errno
import json
import shutil
import socket
import threading

import pytest
import torch
from merge_fixtures import Shape, adapter_config, full_adapter, shard_adapter
from nxd_files import write_sharded_checkpoint
from safetensors.torch import load_file

from llm_pipeline import consolidate, gather
from llm_pipeline.errors import CheckpointError
from llm_pipeline.jobs.sagemaker_env import JobHosts
from llm_pipeline.weights.checkpoints import is_sealed, newest_complete, write_seal


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def part(root, node: int, files: dict[str, bytes]):
    folder = root / "checkpoints" / "checkpoint-4"
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    write_seal(folder, node=node, nodes=2)
    return folder


def test_a_hosts_part_travels_to_the_first_host_and_completes_the_checkpoint(tmp_path):
    first = part(tmp_path / "algo-1", 0, {"trainer_state.json": b"{}", "model/__0_0.distcp": b"a" * 9})
    other = part(tmp_path / "algo-2", 1, {"model/__1_0.distcp": bytes(range(256)) * 40_000})  # > one chunk
    assert not is_sealed(first)
    port, received = free_port(), []
    leader = threading.Thread(
        target=lambda: received.extend(gather.receive(first.parent, senders=1, port=port, wait_s=60))
    )
    leader.start()
    sent = gather.send(gather.newest_sealed_here(other.parent, 1), node=1, leader="127.0.0.1", port=port, wait_s=60)
    leader.join(timeout=60)

    assert received == [(1, "checkpoint-4", sent)]
    assert (first / "model" / "__1_0.distcp").read_bytes() == (other / "model" / "__1_0.distcp").read_bytes()
    assert json.loads((first / "hpl-complete-node1.json").read_text())["node"] == 1
    assert newest_complete(first.parent) == (4, first)
    assert not list(first.rglob("*.part"))


def test_unsealed_checkpoints_are_left_to_the_first_host(tmp_path, capsys):
    folder = tmp_path / "checkpoints" / "checkpoint-4"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text("{}")
    cfg = type("Cfg", (), {"paths": type("Paths", (), {"checkpoints_dir": tmp_path / "checkpoints"})()})()
    env = {"SM_HOSTS": '["algo-1", "algo-2"]', "SM_CURRENT_HOST": "algo-2", "SM_MASTER_PORT": str(free_port())}
    gather.gather(cfg, env)
    assert "not sealed (written before seals existed)" in capsys.readouterr().out


def test_the_first_host_assembles_the_checkpoint_outside_its_synced_folder(tmp_path):
    """Links to its own files, the other host's files written over any stale copy it holds (a restore
    brought back every host's files); its own folder, which SageMaker uploads, is left as it was."""
    first = part(tmp_path / "algo-1", 0, {"trainer_state.json": b"{}", "model/__0_0.distcp": b"a" * 9})
    (first / "model" / "__1_0.distcp").write_bytes(b"stale")  # restored from an earlier attempt
    other = part(tmp_path / "algo-2", 1, {"model/__1_0.distcp": b"fresh" * 3})
    assert gather.link_own_part(first, tmp_path / "linked" / "checkpoints").joinpath("trainer_state.json").is_symlink()
    assembled = gathered_by_socket(first, other, tmp_path / "gathered" / "checkpoints")

    assert (assembled / "model" / "__1_0.distcp").read_bytes() == b"fresh" * 3
    assert not (assembled / "model" / "__1_0.distcp").is_symlink()
    assert (first / "model" / "__1_0.distcp").read_bytes() == b"stale"  # not written through the link
    assert not (first / "hpl-complete-node1.json").exists()
    assert is_sealed(assembled)


def gathered_by_socket(first, other, gathered):
    """The first host's part linked into ``gathered``, the other's sent over a real socket."""
    assembled = gather.link_own_part(first, gathered)
    port = free_port()
    leader = threading.Thread(target=lambda: gather.receive(gathered, senders=1, port=port, wait_s=60))
    leader.start()
    gather.send(other, node=1, leader="127.0.0.1", port=port, wait_s=60)
    leader.join(timeout=60)
    return assembled


def test_a_neuron_checkpoint_split_over_two_hosts_consolidates_after_gather(tmp_path):
    """With xser, neuronx-distributed 2.26 gives each data-parallel rank a share of every tensor file
    (trainer/checkpoint.py _xser_save_data: bins per rank); rank 0 writes the references, metadata and
    markers. With data parallelism across two hosts each disk holds part of the tensors."""
    shape, targets = Shape(), ("q_proj", "v_proj")
    full = full_adapter(shape, targets)
    ranks, metadata = shard_adapter(shape, full, 2, fuse_qkv=False)
    first = write_sharded_checkpoint(
        tmp_path / "algo-1" / "checkpoints" / "checkpoint-4", ranks, metadata, adapter_config(targets), xser=True
    )
    other = tmp_path / "algo-2" / "checkpoints" / "checkpoint-4"
    shutil.copytree(first, other)
    tensors = sorted(first.rglob("tensor_*.pt"))

    def seconds(path):  # tensor_<i>.pt: odd i on the second host's ranks, even on the first's
        return path.name.startswith("tensor_") and int(path.stem.split("_")[1]) % 2 == 1

    for path in [path for path in other.rglob("*") if path.is_file() and not seconds(path)]:
        path.unlink()
    theirs = [path for path in tensors if seconds(path)]
    for path in theirs:
        path.unlink()
    write_seal(first, node=0, nodes=2)
    write_seal(other, node=1, nodes=2)
    assert len(json.loads((other / "hpl-complete-node1.json").read_text())["files"]) == len(theirs) > 0
    with pytest.raises(CheckpointError):
        consolidate.consolidate_checkpoint(first, tmp_path / "half")

    assembled = gathered_by_socket(first, other, tmp_path / "gathered" / "checkpoints")
    assert is_sealed(assembled)
    rebuilt = load_file(
        consolidate.consolidate_checkpoint(assembled, tmp_path / "adapter") / "adapter_model.safetensors"
    )
    assert sorted(rebuilt) == sorted(full) and all(torch.equal(rebuilt[name], full[name]) for name in full)


# Each node's files of a torch FSDP2 checkpoint: node 0 also writes the shared ones.
SHARED = {
    "trainer_state.json": b"{}",
    "scheduler.pt": b"lr",
    "optimizer_0/.metadata": b"md",
    "adapter_config.json": b"{}",
}


def node_files(node: int, step: int) -> dict[str, bytes]:
    own = {f"optimizer_0/__{node}_0.distcp": b"s" * (step + node), f"rng_state_{node}.pth": b"r"}
    return {**own, **(SHARED if node == 0 else {})}


def saved(root, steps: tuple[int, ...], nodes: tuple[int, ...] = (0, 1)):
    """A host's checkpoints folder holding ``nodes``' sealed parts of each step (both after a restore; its
    own only within one job)."""
    for step in steps:
        for node in nodes:  # each part as its own host wrote and sealed it
            written = root / "written" / str(node) / f"checkpoint-{step}"
            for name, data in node_files(node, step).items():
                (written / name).parent.mkdir(parents=True, exist_ok=True)
                (written / name).write_bytes(data)
            write_seal(written, node=node, nodes=2)
            shutil.copytree(written, root / "checkpoints" / written.name, dirs_exist_ok=True)
    return root / "checkpoints"


NAMES = ("127.0.0.1", "localhost")  # 127.0.0.1 sorts first: the first host


def agree_once(tmp_path, checkpoints: tuple, port: int, options: dict) -> tuple[dict, bool]:
    """One agreement of both hosts over ``port``: (host -> resume folder, whether the first host found it taken)."""
    resumes, taken = {}, []

    def agree(host, folder):
        hosts = JobHosts(hosts=NAMES, current=host, master_port=port)
        resume_dir = tmp_path / host / "scratch" / "resume"
        try:
            resumes[host] = gather.agree_on_resume(folder, hosts, resume_dir=resume_dir, wait_s=60, **options)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            taken.append(host)

    threads = [threading.Thread(target=agree, args=pair) for pair in zip(NAMES, checkpoints, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    return resumes, bool(taken)


def agree_over_a_socket(tmp_path, checkpoints: tuple, **options) -> dict:
    """Both hosts run gather.agree_on_resume at once over a real socket; host -> the folder it resumes from.
    Another test's process may take the free port between free_port() and the first host's bind (seen with make
    test's four workers): then both try again on a new port; any other failure is the test's."""
    for _ in range(3):
        resumes, taken = agree_once(tmp_path, checkpoints, free_port(), options)
        if not taken:
            return resumes
    raise AssertionError("the first host's port was taken by another process three times")


def test_within_one_job_each_host_holds_its_part_and_the_others_get_the_shared_files(tmp_path):
    first, second = saved(tmp_path / "algo-1", (2, 4), nodes=(0,)), saved(tmp_path / "algo-2", (2, 4), nodes=(1,))
    own = sorted(p.relative_to(second).as_posix() for p in second.rglob("*"))

    resumes = agree_over_a_socket(tmp_path, (first, second))

    resume = tmp_path / "localhost" / "scratch" / "resume" / "checkpoint-4"
    assert resumes == {"127.0.0.1": first / "checkpoint-4", "localhost": resume}
    for name, data in {**SHARED, **node_files(1, 4)}.items():
        assert (resume / name).read_bytes() == data, name
    assert (
        resume / "optimizer_0" / "__1_0.distcp"
    ).resolve() == second / "checkpoint-4" / "optimizer_0" / "__1_0.distcp"
    assert not (resume / "optimizer_0" / "__0_0.distcp").exists() and not (resume / "rng_state_0.pth").exists()
    # nothing received lands in the second host's checkpoints folder (synced: it would reach S3 twice)
    assert sorted(p.relative_to(second).as_posix() for p in second.rglob("*")) == own


def test_hosts_whose_restores_differ_agree_on_the_newest_checkpoint_all_hold_their_part_of(tmp_path):
    first, second = saved(tmp_path / "algo-1", (2, 4)), saved(tmp_path / "algo-2", (2, 4))
    (second / "checkpoint-4" / "optimizer_0" / "__1_0.distcp").unlink()  # its own shard came back short
    (second / "checkpoint-2" / "optimizer_0" / "__0_0.distcp").unlink()  # another rank's: never read there

    resumes = agree_over_a_socket(tmp_path, (first, second))

    assert resumes["127.0.0.1"] == first / "checkpoint-2"
    assert resumes["localhost"] == tmp_path / "localhost" / "scratch" / "resume" / "checkpoint-2"
    assert not (first / "checkpoint-4").exists() and not (second / "checkpoint-4").exists()


def test_a_neuron_resume_needs_the_whole_checkpoint_on_every_host(tmp_path):
    first, second = saved(tmp_path / "algo-1", (2, 4)), saved(tmp_path / "algo-2", (2, 4))
    (second / "checkpoint-4" / "optimizer_0" / "__0_0.distcp").unlink()

    resumes = agree_over_a_socket(tmp_path, (first, second), by_part=False)

    assert resumes == {"127.0.0.1": first / "checkpoint-2", "localhost": second / "checkpoint-2"}  # nothing sent
    assert not (tmp_path / "localhost" / "scratch").exists()
    assert [newest_complete(folder) for folder in (first, second)] == [
        (2, first / "checkpoint-2"),
        (2, second / "checkpoint-2"),
    ]


def test_hosts_without_a_checkpoint_start_from_the_base_model(tmp_path):
    resumes = agree_over_a_socket(tmp_path, (tmp_path / "a" / "checkpoints", tmp_path / "b" / "checkpoints"))
    assert resumes == {"127.0.0.1": None, "localhost": None}
