"""The transformers internals the torch engine overrides or patches (training/torch/backend.py), read in the
installed transformers: if an upstream release moves one, the override or patch would silently do nothing.
Their behaviour is tested end to end elsewhere (test_train_torch: the exact resume inside an epoch;
test_sharded_optimizer_load: the FSDP2 optimizer; test_checkpoint_seals: the seal after the save)."""

from __future__ import annotations

import ast
import inspect

import transformers.trainer
from transformers import Trainer

from llm_pipeline.training.torch import backend as torch_backend


def _calls(function) -> list[str]:
    tree = ast.parse(inspect.getsource(function).lstrip().replace("\n    ", "\n"))
    return [ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)]


def test_the_overridden_methods_keep_the_signatures_and_callers_the_engine_assumes():
    engine = torch_backend.engine_trainer_class()
    for name in ("_load_optimizer_and_scheduler", "_save_checkpoint", "create_accelerator_and_postprocess"):
        upstream = inspect.signature(getattr(Trainer, name))
        assert list(inspect.signature(getattr(engine, name)).parameters) == list(upstream.parameters), name
    assert "self._load_optimizer_and_scheduler" in _calls(Trainer._prepare_for_training)
    assert "self._prepare_for_training" in _calls(Trainer._inner_training_loop)
    assert "self._get_output_dir" in _calls(Trainer._save_checkpoint)
    assert list(inspect.signature(Trainer._get_output_dir).parameters) == ["self", "trial"]
    assert transformers.trainer.SCHEDULER_NAME == "scheduler.pt"
