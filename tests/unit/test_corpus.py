"""The labelled incident-bundle corpus (tests/corpus/): every bundle loads, every label is well
formed, and the corpus covers what the benchmark needs. Scoring the engine is not done here."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from relaunch.connectors.bundles import read_bundle
from relaunch.models.recovery import Category

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
BUNDLES = sorted(p for p in CORPUS.iterdir() if p.is_dir() and re.match(r"^\d{2}-", p.name))
NO_CULPRIT = {"application", "preemption", "time_limit", "user_cancel", "infrastructure"}
CATEGORIES = {c.value for c in Category}


def _expected(bundle: Path) -> dict:
    return json.loads((bundle / "expected.json").read_text())


@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.name for b in BUNDLES])
def test_bundle_loads(bundle: Path) -> None:
    loaded = read_bundle(bundle)
    assert loaded.job.nodes, "a bundle names its allocated nodes"
    assert loaded.job_log.strip(), "a bundle has a job log"
    assert set(loaded.job.node_states) <= set(loaded.job.nodes)
    assert set(loaded.node_logs) <= set(loaded.job.nodes), "node logs are named after job nodes"
    if loaded.job.ranks is not None:
        assert set(loaded.job.ranks.values()) <= set(loaded.job.nodes)
    size = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file())
    assert size <= 100_000, f"{bundle.name} is {size} bytes"


@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.name for b in BUNDLES])
def test_expected_is_well_formed(bundle: Path) -> None:
    exp = _expected(bundle)
    assert set(exp) == {"category", "culprit_nodes", "action", "why"}
    assert exp["category"] in CATEGORIES
    culprits = exp["culprit_nodes"]
    assert isinstance(culprits, list) and all(isinstance(n, str) for n in culprits)
    assert culprits == sorted(set(culprits)), "culprits are sorted and unique"
    nodes = json.loads((bundle / "job.json").read_text())["nodes"]
    assert set(culprits) <= set(nodes), "culprits are nodes of the job"
    if exp["category"] in NO_CULPRIT:
        assert culprits == [], f"{exp['category']} never blames a node"
    assert isinstance(exp["why"], str) and len(exp["why"]) > 20


def test_corpus_coverage() -> None:
    labels = [_expected(b) for b in BUNDLES]
    assert len(labels) >= 40
    counts = Counter(e["category"] for e in labels)
    for category in CATEGORIES:
        assert counts[category] >= 3, f"only {counts[category]} {category} bundle(s)"
    assert counts["application"] >= 12
    assert sum(len(e["culprit_nodes"]) >= 2 for e in labels) >= 3, "several-culprit bundles"
    assert len({b.name[:2] for b in BUNDLES}) == len(BUNDLES), "bundle numbers are unique"


def test_readme_lists_every_bundle() -> None:
    readme = (CORPUS / "README.md").read_text()
    for b in BUNDLES:
        exp = _expected(b)
        assert f"| `{b.name}` | {exp['category']} |" in readme
