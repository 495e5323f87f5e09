"""prepare: processes per node have one source (parallel.devices_per_node); a node that disagrees stops the run."""

from __future__ import annotations

from payload_configs import write_config

from llm_pipeline import prepare


def test_a_node_with_other_device_count_fails_naming_both(hpl_env, tmp_path, monkeypatch, capsys):
    path = write_config(tmp_path / "run.toml", hpl_env, parallel={"devices_per_node": 1})
    monkeypatch.setenv("HPL_DEVICES_PER_NODE", "32")
    assert prepare.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: parallel.devices_per_node is 1 but this node has HPL_DEVICES_PER_NODE=32")
    assert "set parallel.devices_per_node = 32" in err


def test_matching_or_unknown_node_device_count_passes(hpl_env, tmp_path, monkeypatch, capsys):
    path = write_config(tmp_path / "run.toml", hpl_env, parallel={"devices_per_node": 1})
    monkeypatch.setenv("HPL_DEVICES_PER_NODE", "1")
    assert prepare.main(["--config", str(path)]) == 0
    assert "processes per node: 1 (parallel.devices_per_node, equals HPL_DEVICES_PER_NODE)" in capsys.readouterr().out
    monkeypatch.delenv("HPL_DEVICES_PER_NODE")
    assert prepare.main(["--config", str(path)]) == 0
    assert "HPL_DEVICES_PER_NODE is not set here" in capsys.readouterr().out


def test_a_neuron_run_is_told_once_that_the_trn1_lane_is_frozen(hpl_env, tmp_path, capsys):
    neuron = write_config(tmp_path / "neuron.toml", hpl_env, train={"backend": "neuron"}, data={"packing": False})
    assert prepare.main(["--config", str(neuron)]) == 0
    out = capsys.readouterr().out
    assert out.count("frozen at Neuron SDK 2.26.1") == 1
    assert "defect fixes only (docs/versions.md)" in out and "trn2 lane (docs/trainium2.md)" in out
    torch_run = write_config(tmp_path / "torch.toml", hpl_env, train={"backend": "torch"})
    assert prepare.main(["--config", str(torch_run)]) == 0
    assert "frozen" not in capsys.readouterr().out
