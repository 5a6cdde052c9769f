"""The attribution engine on the labelled corpora (tests/corpus, tests/corpus_holdout): the
issue's bar (category accuracy and culprit exact-match at least 95%), the rule that no
application case ever blames a node, and the trust model's rule that a node named only by the
job's output is excluded, never drained."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from relaunch.connectors.bundles import read_bundle
from relaunch.detection.attribution import attribute_bundle
from relaunch.detection.signatures import Catalogue
from relaunch.models.recovery import Action, Category, Verdict

TESTS = Path(__file__).resolve().parents[1]
# The corpus the rules were refined against, and the one written afterwards without the engine.
BUNDLES = sorted(
    p.parent
    for name in ("corpus", "corpus_holdout")
    for p in (TESTS / name).glob("*/expected.json")
)
Results = list[tuple[str, dict[str, Any], Verdict]]


def _results(engine: str) -> Results:
    catalogue = Catalogue.load(engine=engine)
    out = []
    for path in BUNDLES:
        expected = json.loads((path / "expected.json").read_text())
        out.append((path.name, expected, attribute_bundle(read_bundle(path), catalogue)))
    return out


@pytest.fixture(scope="module", params=["hyperscan", "literals"])
def results(request: pytest.FixtureRequest) -> Results:
    return _results(request.param)


def test_accuracy_meets_the_bar(results: Results) -> None:
    assert len(results) >= 80
    category = [n for n, e, v in results if e["category"] != v.category.value]
    culprits = [n for n, e, v in results if sorted(e["culprit_nodes"]) != sorted(v.culprit_nodes)]
    assert len(category) <= 0.05 * len(results), category
    assert len(culprits) <= 0.05 * len(results), culprits


def test_no_application_case_blames_or_drains_a_node(
    results: Results,
) -> None:
    application = [(n, v) for n, e, v in results if e["category"] == "application"]
    assert len(application) >= 12
    for name, verdict in application:
        assert verdict.culprit_nodes == [], name
        assert verdict.action is not Action.ISOLATE_AND_RESTART, name
        assert verdict.category is Category.APPLICATION, name


def test_a_node_named_only_by_the_jobs_output_is_excluded_not_drained(results: Results) -> None:
    job_only = [(n, e, v) for n, e, v in results if e["action"] == "exclude_and_restart"]
    assert len(job_only) >= 5
    for name, expected, verdict in job_only:
        assert verdict.action is Action.EXCLUDE_AND_RESTART, name
        assert all(verdict.corroboration[n] == [] for n in expected["culprit_nodes"]), name


def test_actions_meet_the_bar_and_only_corroborated_culprits_are_isolated(
    results: Results,
) -> None:
    wrong = [(n, e["action"], v.action.value) for n, e, v in results if e["action"] != v.action]
    assert len(wrong) <= 0.05 * len(results), wrong
    for name, _, verdict in results:
        if verdict.action is Action.ISOLATE_AND_RESTART:
            assert all(verdict.corroboration[n] for n in verdict.culprit_nodes), name
