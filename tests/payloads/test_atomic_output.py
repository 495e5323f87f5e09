"""AtomicOutputDir.write: the one place merge and consolidate publish a folder or turn a failed write
(disk full, a file changing underneath) into one error that leaves nothing behind."""

from __future__ import annotations

import pytest

from llm_pipeline.errors import CheckpointError
from llm_pipeline.weights.atomic_output import AtomicOutputDir


def test_a_finished_build_is_published_and_its_result_returned(tmp_path):
    def build(partial):
        (partial / "model.safetensors").write_bytes(b"whole")
        return 1

    assert AtomicOutputDir(tmp_path / "merged", overwrite=False).write("merge", build) == 1
    assert [path.name for path in tmp_path.iterdir()] == ["merged"]
    assert (tmp_path / "merged" / "model.safetensors").read_bytes() == b"whole"


def test_an_os_error_while_writing_names_the_step_and_leaves_nothing(tmp_path):
    def build(partial):
        (partial / "model.safetensors").write_bytes(b"half")
        raise OSError(28, "No space left on device")

    expected = r"consolidation failed while writing .*/merged: \[Errno 28\] No space left on device; nothing was"
    with pytest.raises(CheckpointError, match=expected):
        AtomicOutputDir(tmp_path / "merged", overwrite=False).write("consolidation", build)
    assert list(tmp_path.iterdir()) == []
