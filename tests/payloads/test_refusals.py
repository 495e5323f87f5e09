"""One table of what a setting needs (refusals.REFUSALS): the neuron backend, the torch engine on each device,
the runtime's packages and hpctl's instance types each filter it, and no other module keeps a table of its own."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest
from payload_configs import tiny_config

from llm_pipeline import config, refusals
from llm_pipeline.config import ConfigError
from llm_pipeline.training import device

ROOT = Path(__file__).parents[2]


def _config(hpl_env, entry: refusals.Refusal):
    """The tiny config (packing off) with just this entry's value set."""
    sections = {"data": {"packing": False}, "train": {}}
    sections[entry.section][entry.name] = entry.value
    return tiny_config(hpl_env, **sections)


@pytest.mark.parametrize("entry", refusals.REFUSALS, ids=lambda entry: f"{entry.key}={entry.value}")
def test_each_place_refuses_what_the_table_says_with_its_reason(hpl_env, entry):
    cfg = _config(hpl_env, entry)
    if refusals.NOT_TRN1 in entry.needs:
        with pytest.raises(ConfigError, match=f"{entry.key}: .* cannot run on the neuron backend"):
            config.check_backend(cfg, "neuron")
    else:
        config.check_backend(cfg, "neuron")
    on_neuron = device.refused_levers(cfg, device.NEURON)
    assert bool(on_neuron) == bool(entry.needs & {refusals.NOT_TRN2, refusals.CUDA})
    assert all(entry.why in line for line in on_neuron)
    assert bool(device.refused_levers(cfg, device.CPU)) == (refusals.CUDA in entry.needs)
    assert device.refused_levers(cfg, device.CUDA) == []


def _literal_pairs(tree: ast.Module) -> set[tuple[object, object]]:
    """Every (a, b) of adjacent constants in a module-level tuple literal."""
    found = set()
    for statement in tree.body:
        if isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value is not None:
            for node in ast.walk(statement.value):
                if isinstance(node, ast.Tuple):
                    values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
                    found |= set(itertools.pairwise(values))
    return found


def test_no_other_module_keeps_a_refusal_table():
    owner = ROOT / "payloads" / "llm_pipeline" / "refusals.py"
    pairs = {(entry.name, entry.value) for entry in refusals.REFUSALS}
    sources = [p for folder in ("payloads", "hpctl", "stacks") for p in (ROOT / folder).rglob("*.py") if p != owner]
    tables = [str(p.relative_to(ROOT)) for p in sources if _literal_pairs(ast.parse(p.read_text())) & pairs]
    assert len(sources) > 100 and tables == []
    old_table = 'LEVER_PACKAGES = (("liger_kernel", True, "liger_kernel", "liger-kernel"),)'  # the finder sees one
    assert _literal_pairs(ast.parse(old_table)) & pairs


def test_each_reason_is_written_once():
    sources = [p.read_text() for folder in ("payloads", "hpctl") for p in (ROOT / folder).rglob("*.py")]
    for entry in refusals.REFUSALS:
        opening = entry.why[:40]
        assert sum(text.count(opening) for text in sources) == 1, opening
