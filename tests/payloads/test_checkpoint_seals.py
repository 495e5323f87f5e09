"""Checkpoint seals: complete means every node's seal and every file it lists, at its size, whatever
order a restore brought them back in; pruning keeps a node's newest sealed checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from nxd_files import write_sharded_checkpoint
from payload_configs import tiny_config
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import CallbackHandler

from llm_pipeline.data import prepare_if_stale, training_inputs
from llm_pipeline.errors import StepError
from llm_pipeline.run_state import discard_after
from llm_pipeline.training import parts
from llm_pipeline.training.callbacks import SealCheckpoints
from llm_pipeline.training.neuron.backend import SEAL_RENDEZVOUS, seal_checkpoints
from llm_pipeline.training.torch import backend as torch_backend
from llm_pipeline.weights.checkpoints import (
    checkpoint_folders,
    complete_checkpoints,
    is_sealed,
    newest_complete,
    prune,
    seal_name,
    write_seal,
)


def checkpoint(root: Path, step: int, files: dict[str, bytes]) -> Path:
    folder = root / f"checkpoint-{step}"
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def two_host_checkpoint(root: Path, step: int) -> Path:
    """Each host wrote its own shard on its own disk, sealed its part; S3 then holds the union."""
    folder = checkpoint(root / "host-1", step, {"trainer_state.json": b"{}", "model/__0_0.distcp": b"a" * 10})
    write_seal(folder, node=0, nodes=2)
    other = checkpoint(root / "host-2", step, {"model/__1_0.distcp": b"b" * 12})
    write_seal(other, node=1, nodes=2)
    restored = root / "restored" / folder.name
    for source in (folder, other):
        for path in source.rglob("*"):
            if path.is_file():
                (restored / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
                (restored / path.relative_to(source)).write_bytes(path.read_bytes())
    return restored


def test_the_union_of_both_hosts_sealed_parts_is_complete(tmp_path):
    restored = two_host_checkpoint(tmp_path, 20)
    assert complete_checkpoints(restored.parent) == [(20, restored)]


def test_a_missing_or_short_file_or_seal_makes_a_checkpoint_incomplete(tmp_path):
    for damage in ("missing shard", "short shard", "missing seal", "cut seal"):
        root = tmp_path / damage.replace(" ", "-")
        previous = two_host_checkpoint(root, 10)
        newest = two_host_checkpoint(root, 20)
        if damage == "missing shard":
            (newest / "model" / "__1_0.distcp").unlink()
        elif damage == "short shard":
            (newest / "model" / "__0_0.distcp").write_bytes(b"a" * 4)
        elif damage == "missing seal":
            (newest / seal_name(1)).unlink()
        else:
            (newest / seal_name(0)).write_text('{"node": 0, "nod')
        assert (newest / "trainer_state.json").is_file()
        assert newest_complete(newest.parent) == (10, previous), damage


def test_checkpoints_from_before_seals_count_by_trainer_state(tmp_path):
    old = checkpoint(tmp_path, 10, {"trainer_state.json": b"{}"})
    checkpoint(tmp_path, 20, {"adapter_model.safetensors": b"x"})  # no trainer_state.json
    assert complete_checkpoints(tmp_path) == [(10, old)]
    sealed = checkpoint(tmp_path, 30, {"trainer_state.json": b"{}"})
    write_seal(sealed, node=0, nodes=1)
    assert complete_checkpoints(tmp_path) == [(30, sealed)]  # a sealed run trusts only seals


def test_prune_keeps_the_newest_sealed_checkpoints_of_this_node(tmp_path):
    for step in (10, 20, 30):
        write_seal(checkpoint(tmp_path, step, {"__1_0.distcp": b"s"}), node=1, nodes=2)
    checkpoint(tmp_path, 40, {"__1_0.distcp": b"s"})  # being written: not sealed yet
    deleted = prune(tmp_path, keep=2, node=1)
    assert deleted == [tmp_path / "checkpoint-10"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-20", "checkpoint-30", "checkpoint-40"]
    assert prune(tmp_path, keep=2, node=0) == []  # node 0 sealed nothing here


def test_the_neuron_seal_callback_seals_what_neuronx_distributed_wrote_after_the_barrier(tmp_path, monkeypatch):
    """Invoked as NeuronTrainer invokes it (test_neuron_contract: right after _save_checkpoint, through the
    trainer's CallbackHandler, on every rank): the second node's first process seals that node's files."""
    checkpoints = tmp_path / "checkpoints"
    tensors = [{"q_proj.lora_A.weight": torch.ones(4, 8)}, {"q_proj.lora_A.weight": torch.zeros(4, 8)}]
    metadata = {"parameters": {}, "model_weight_transformation_specs": []}
    folder = write_sharded_checkpoint(checkpoints / "checkpoint-4", tensors, metadata, {"r": 4}, xser=True)
    older = write_sharded_checkpoint(checkpoints / "checkpoint-2", tensors, metadata, {"r": 4}, xser=True)
    write_seal(older, node=1, nodes=2)
    args = TrainingArguments(output_dir=str(checkpoints), report_to=[])
    for name, value in {"LOCAL_RANK": "0", "GROUP_RANK": "1", "WORLD_SIZE": "64", "LOCAL_WORLD_SIZE": "32"}.items():
        monkeypatch.setenv(name, value)
    barriers = []
    callback = seal_checkpoints(
        SimpleNamespace(async_save=False),
        lambda tag: barriers.append((tag, (folder / seal_name(1)).is_file())),
        keep=1,
    )
    handler = CallbackHandler([callback], None, None, None, None)
    handler.on_save(args, TrainerState(global_step=4), TrainerControl())

    assert barriers == [(SEAL_RENDEZVOUS, False), (SEAL_RENDEZVOUS, True)]  # every rank's files, then the seal
    seal = json.loads((folder / seal_name(1)).read_text())
    written = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and "hpl-" not in p.name}
    assert seal["node"] == 1 and seal["nodes"] == 2 and set(seal["files"]) == written
    assert any(name.endswith(".pt.tensors/tensor_0.pt") for name in written)  # the xser tensor files too
    assert not is_sealed(folder)  # node 0's seal comes from the first node
    write_seal(folder, node=0, nodes=2)
    assert newest_complete(checkpoints) == (4, folder)
    assert not older.exists()  # keep 1 (train.save_total_limit): this node's older checkpoint pruned


def test_the_previous_checkpoint_goes_only_once_every_node_has_sealed_the_new_one(tmp_path, monkeypatch):
    """Two nodes on one shared file system, save_total_limit 1. Node 0 seals checkpoint-4 between the two
    barriers; node 1's seal may land as late as the second barrier. Until then checkpoint-4 is incomplete, so
    checkpoint-2 must still be there: a crash in that window must leave a checkpoint to resume from."""
    checkpoints = tmp_path / "checkpoints"
    files = {"trainer_state.json": b"{}", "shards/model/dp_rank_00_tp_rank_00_pp_rank_00.pt": b"w" * 8}
    older, newer = checkpoint(checkpoints, 2, files), checkpoint(checkpoints, 4, files)
    for node in (0, 1):
        write_seal(older, node=node, nodes=2)
    for name, value in {"LOCAL_RANK": "0", "GROUP_RANK": "0", "WORLD_SIZE": "64", "LOCAL_WORLD_SIZE": "32"}.items():
        monkeypatch.setenv(name, value)
    resumable = []

    def rendezvous(tag):
        resumable.append([step for step, _ in complete_checkpoints(checkpoints)])  # a crash here resumes from these
        if len(resumable) == 2:
            write_seal(newer, node=1, nodes=2)  # the last node to reach the second barrier seals just before it

    callback = seal_checkpoints(SimpleNamespace(async_save=False), rendezvous, keep=1)
    callback.on_save(SimpleNamespace(output_dir=str(checkpoints)), TrainerState(global_step=4), TrainerControl())
    assert resumable == [[2], [2]]
    assert [step for step, _ in complete_checkpoints(checkpoints)] == [4] and not older.exists()


def test_the_neuron_seal_callback_refuses_asynchronous_saves():
    with pytest.raises(StepError, match="async_save is on"):
        seal_checkpoints(SimpleNamespace(async_save=True), lambda tag: None, keep=2)


def test_a_resume_discards_the_incomplete_checkpoints_after_its_own(tmp_path):
    """A restore cut short leaves checkpoint-20 without a shard; saving step 20 again into it would list
    its leftovers in the new seals, so train deletes it before it starts from checkpoint-10."""
    previous = two_host_checkpoint(tmp_path, 10)
    newest = two_host_checkpoint(tmp_path, 20)
    (newest / "model" / "__1_0.distcp").unlink()
    step, resume = newest_complete(newest.parent)
    assert discard_after(newest.parent, step) == [newest]
    assert not newest.exists() and previous.is_dir() and resume == previous
    assert discard_after(newest.parent, step) == []


def test_a_save_total_limit_of_one_keeps_the_sealed_checkpoint_until_the_next_is_sealed(hpl_env):
    """The trainers prune inside their save, before on_save seals the new checkpoint (transformers 5.24's
    _save_checkpoint and optimum-neuron 0.4.5's alike): given save_total_limit 1, a crash between the two left
    only an unsealed checkpoint. Here the limit is ours: when the seal callback starts at step 4, step 2 is
    still there and sealed; once step 4 is sealed, step 2 goes."""
    cfg = tiny_config(
        hpl_env,
        train={"max_steps": 4, "save_steps": 2, "logging_steps": 2, "save_total_limit": 1},
        data={"validation_fraction": 0.0, "max_samples": 48},
    )
    prepare_if_stale(cfg)
    datasets, tokenizer = training_inputs(cfg)
    plan = parts.make_plan(cfg, "torch", precompile=False)
    trainer, _ = torch_backend.build_trainer(cfg, parts.read(cfg), plan, datasets, tokenizer)
    assert trainer.args.save_total_limit is None
    checkpoints, at_seal = cfg.paths.checkpoints_dir, []

    class BeforeTheSeal(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            at_seal.append(
                (state.global_step, [step for step, folder in checkpoint_folders(checkpoints) if is_sealed(folder)])
            )

    callbacks = trainer.callback_handler.callbacks
    callbacks.insert(next(i for i, cb in enumerate(callbacks) if isinstance(cb, SealCheckpoints)), BeforeTheSeal())
    trainer.train()
    assert at_seal == [(2, []), (4, [2])]
    assert [step for step, _ in checkpoint_folders(checkpoints)] == [4] and is_sealed(checkpoints / "checkpoint-4")
