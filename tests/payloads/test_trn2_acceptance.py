"""The Trainium2 first-node acceptance command on CPU: its device checks report "not a Neuron host",
the 8B and two-node checks "needs a trn2 node", and the rest (the tiny CPU reference, the engine's
save-stop-resume) runs, so the command cannot rot before a trn2 node runs it."""

from __future__ import annotations

import json

import pytest
from payload_configs import write_config

from llm_pipeline import trn2_acceptance

pytestmark = [pytest.mark.main_stack, pytest.mark.engine]


def test_acceptance_on_cpu_skips_the_device_checks_and_runs_the_rest(hpl_env, tmp_path, monkeypatch, capsys):
    for name, value in hpl_env.items():
        monkeypatch.setenv(name, value)
    tiny = write_config(tmp_path / "tiny.toml", hpl_env)
    report = tmp_path / "report"
    assert trn2_acceptance.main(["--report-dir", str(report), "--tiny-config", str(tiny)]) == 0
    out = capsys.readouterr().out
    checks = {c["name"]: c for c in json.loads((report / "acceptance.json").read_text())["checks"]}
    assert list(checks) == ["device", "tiny-parity", "graph-count", "cpu-fallbacks", "resume", "lora-8b", "two-node"]
    for name in ("device", "graph-count", "cpu-fallbacks"):
        assert (checks[name]["status"], checks[name]["detail"]) == ("SKIP", "not a Neuron host")
    parity = checks["tiny-parity"]
    assert parity["status"] == "SKIP" and parity["detail"].startswith("not a Neuron host (the CPU reference trained")
    losses = parity["figures"]["cpu_losses"]
    assert len(losses) == trn2_acceptance.TINY_STEPS and losses[-1] < losses[0]  # the reference really trained
    assert checks["resume"]["status"] == "PASS", checks["resume"]["detail"]
    assert checks["resume"]["figures"]["resumed"] == pytest.approx(
        checks["resume"]["figures"]["uninterrupted"], abs=1e-3
    )
    assert checks["lora-8b"]["detail"] == "needs a trn2 node"
    assert checks["two-node"]["detail"].startswith("needs a trn2 node")
    assert "| resume | PASS |" in (report / "acceptance.md").read_text()
    assert "SKIP  device         not a Neuron host" in out and "no check failed" in out


def test_the_cpu_reference_is_reproducible_from_its_seed():
    """The parity check compares two devices from one seed: on one device the seed must decide everything."""
    first, second = trn2_acceptance.train_tiny("cpu", steps=3), trn2_acceptance.train_tiny("cpu", steps=3)
    assert first.losses == second.losses and first.graphs == [] and first.fallbacks == []


def test_the_fallback_count_says_its_pattern_is_unconfirmed():
    seen = ["op aten::_foo.bar falls back to the CPU", "aten::baz: fallback", "unrelated warning"]
    found = [message for message in seen if trn2_acceptance.FALLBACK_WORDS.search(message)]
    check = trn2_acceptance.fallback_check(found)
    assert check.figures["operators"] == ["aten::_foo.bar", "aten::baz"]
    assert "2 fallback report(s)" in check.detail and "unconfirmed" in check.detail
    assert check.figures["confirmed"] is False
