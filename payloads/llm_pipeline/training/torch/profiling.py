"""`train.profile`: torch.profiler over a window of optimizer steps, one trace per rank.

The window FIRST-LAST counts optimizer steps from 1, as the progress lines do. Each rank writes
``<run>/profile/rank<R>.<...>.pt.trace.json`` (TensorBoard's profiler plugin and Perfetto read it)
and, on a GPU, ``memory_snapshot_rank<R>.pickle``: the CUDA allocator's record of every allocation and
free in the window with its stack (https://pytorch.org/memory_viz draws it). torch 2.13 deprecates the
profiler's memory timeline for this record; its warning names ``_export_memory_snapshot``, the function
is ``torch.cuda.memory._dump_snapshot``. On a CPU the trace's own memory events are all there is. See
docs/training.md, "Reading a profile".
"""

from __future__ import annotations

import os
from pathlib import Path

from transformers import TrainerCallback

# Allocation events the CUDA allocator keeps for the snapshot, the oldest dropped first: torch's default keeps
# every one, in host memory, for as long as the window runs.
MEMORY_HISTORY_ENTRIES = 100_000


class StepProfiler(TrainerCallback):
    def __init__(self, *, window: tuple[int, int], folder: Path):
        self.first, self.last = window
        self.folder = Path(folder)
        self.rank = int(os.environ.get("RANK", "0"))
        self.profiler = None
        self.records_cuda_memory = False

    def _start(self):
        import torch
        from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

        self.records_cuda_memory = torch.cuda.is_available()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.records_cuda_memory else [])
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.records_cuda_memory:
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
        self.profiler = profile(
            activities=activities,
            record_shapes=True,
            profile_memory=True,
            with_stack=True,  # the trace's flame view of where time goes
            on_trace_ready=tensorboard_trace_handler(str(self.folder), worker_name=f"rank{self.rank}"),
        )
        self.profiler.start()

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.first and self.profiler is None:
            self._start()

    def on_step_end(self, args, state, control, **kwargs):
        if self.profiler is None or state.global_step < self.last:
            return
        self._stop(snapshot=self.folder / f"memory_snapshot_rank{self.rank}.pickle")
        if self.rank == 0:
            print(f"profile of steps {self.first}-{self.last} written to {self.folder}", flush=True)

    def on_train_end(self, args, state, control, **kwargs):
        if self.profiler is not None:  # training ended inside the window
            self._stop(snapshot=None)

    def _stop(self, *, snapshot: Path | None):
        import torch

        self.profiler.stop()
        self.profiler = None
        if self.records_cuda_memory:
            if snapshot is not None:
                torch.cuda.memory._dump_snapshot(str(snapshot))
            torch.cuda.memory._record_memory_history(enabled=None)
            self.records_cuda_memory = False
