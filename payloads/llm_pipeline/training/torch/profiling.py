"""`train.profile`: torch.profiler over a window of optimizer steps, one trace per rank.

The window FIRST-LAST counts optimizer steps from 1, as the progress lines do. Each rank writes
``<run>/profile/rank<R>.<...>.pt.trace.json`` (TensorBoard's profiler plugin and Perfetto read it)
and ``memory_timeline_rank<R>.json.gz`` (allocated bytes over time by category). See
docs/training.md, "Reading a profile".
"""

from __future__ import annotations

import os
from pathlib import Path

from transformers import TrainerCallback


class StepProfiler(TrainerCallback):
    def __init__(self, *, window: tuple[int, int], folder: Path):
        self.first, self.last = window
        self.folder = Path(folder)
        self.rank = int(os.environ.get("RANK", "0"))
        self.profiler = None

    def _start(self):
        import torch
        from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.folder.mkdir(parents=True, exist_ok=True)
        self.profiler = profile(
            activities=activities,
            record_shapes=True,
            profile_memory=True,
            with_stack=True,  # the memory timeline needs stacks to sort allocations into categories
            on_trace_ready=tensorboard_trace_handler(str(self.folder), worker_name=f"rank{self.rank}"),
        )
        self.profiler.start()

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.first and self.profiler is None:
            self._start()

    def on_step_end(self, args, state, control, **kwargs):
        if self.profiler is None or state.global_step < self.last:
            return
        import torch

        self.profiler.stop()
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
        timeline = self.folder / f"memory_timeline_rank{self.rank}.json.gz"
        self.profiler.export_memory_timeline(str(timeline), device=device)
        if self.rank == 0:
            print(f"profile of steps {self.first}-{self.last} written to {self.folder}", flush=True)
        self.profiler = None

    def on_train_end(self, args, state, control, **kwargs):
        if self.profiler is not None:  # training ended inside the window
            self.profiler.stop()
            self.profiler = None
