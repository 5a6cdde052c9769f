"""The public-log corpus (tests/corpus_public/): every bundle loads and carries its source thread
and what that thread concluded; the engine's score on it holds at least the one docs/attribution.md
reports; an application error never blames or drains a node; a culprit is drained only on trusted
evidence."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from relaunch.connectors.bundles import read_bundle
from relaunch.detection.attribution import attribute_bundle
from relaunch.detection.signatures import Catalogue
from relaunch.models.recovery import Action, Category, Verdict

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "corpus_public"
BUNDLES = sorted(p for p in CORPUS.iterdir() if p.is_dir() and re.match(r"^\d{2}-", p.name))
CATEGORIES = {c.value for c in Category}
ACTIONS = {a.value for a in Action}
# docs/attribution.md, "Public-log corpus": `category 16/20, culprits 20/20, action 19/20`.
_SCORE = re.compile(r"category (\d+)/(\d+), culprits (\d+)/\d+, action (\d+)/\d+")
Results = list[tuple[str, dict[str, Any], Verdict]]


def _expected(bundle: Path) -> dict[str, Any]:
    return dict(json.loads((bundle / "expected.json").read_text()))


@pytest.fixture(scope="module", params=["hyperscan", "literals"])
def results(request: pytest.FixtureRequest) -> Results:
    catalogue = Catalogue.load(engine=request.param)
    return [(b.name, _expected(b), attribute_bundle(read_bundle(b), catalogue)) for b in BUNDLES]


@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.name for b in BUNDLES])
def test_bundle_loads_and_is_labelled_from_its_thread(bundle: Path) -> None:
    loaded = read_bundle(bundle)
    assert loaded.job_log.strip() and loaded.job.nodes
    assert set(loaded.node_logs) <= set(loaded.job.nodes)
    exp = _expected(bundle)
    assert set(exp) == {"category", "culprit_nodes", "action", "why", "source", "concluded"}
    assert exp["category"] in CATEGORIES and exp["action"] in ACTIONS
    assert exp["culprit_nodes"] == sorted(set(exp["culprit_nodes"]))
    assert set(exp["culprit_nodes"]) <= set(loaded.job.nodes)
    assert re.match(r"^https://github\.com/[\w.-]+/[\w.-]+/(?:issues|pull)/\d+$", exp["source"])
    assert len(exp["concluded"]) > 10
    if exp["category"] in ("application", "infrastructure"):
        assert exp["culprit_nodes"] == []
    readme = (CORPUS / "README.md").read_text()
    assert f"| `{bundle.name}` | {exp['category']} |" in readme


def test_the_corpus_covers_the_issues_classes() -> None:
    labels = [_expected(b) for b in BUNDLES]
    assert len(labels) >= 20
    counts = {c: sum(e["category"] == c for e in labels) for c in CATEGORIES}
    assert counts["infrastructure"] >= 8 and counts["application"] >= 3
    assert counts["gpu_hardware"] >= 2 and counts["network"] >= 2


def test_the_score_holds_what_the_docs_report(results: Results) -> None:
    doc = (ROOT / "docs" / "attribution.md").read_text()
    found = _SCORE.search(doc[doc.index("Public-log corpus") :])
    assert found is not None, "docs/attribution.md reports the public corpus score"
    category, total, culprits, action = (int(g) for g in found.groups())
    assert total == len(results)
    got_category = sum(e["category"] == v.category.value for _, e, v in results)
    got_culprits = sum(e["culprit_nodes"] == sorted(v.culprit_nodes) for _, e, v in results)
    got_action = sum(e["action"] == v.action.value for _, e, v in results)
    misses = [
        (n, e["category"], v.category.value)
        for n, e, v in results
        if e["category"] != v.category.value
    ]
    assert got_category >= category, misses
    assert got_culprits >= culprits
    assert got_action >= action


def test_no_application_error_blames_or_drains_a_node(results: Results) -> None:
    for name, exp, verdict in results:
        if exp["category"] == "application" or verdict.category is Category.APPLICATION:
            assert verdict.culprit_nodes == [], name
            assert verdict.action is not Action.ISOLATE_AND_RESTART, name
        if verdict.action is Action.ISOLATE_AND_RESTART:
            assert all(verdict.corroboration[n] for n in verdict.culprit_nodes), name
