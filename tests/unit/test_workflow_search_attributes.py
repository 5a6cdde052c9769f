"""The search attributes and stages have one source (relaunch.models.search_attributes): the
workflow's keys, the models' Stage and the checked-in registration script follow it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from temporalio.common import SearchAttributeIndexedValueType as Indexed
from temporalio.common import SearchAttributeKey

from relaunch.models import recovery
from relaunch.models import search_attributes as sa
from relaunch.workflows import attributes as workflow

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "register-search-attributes.sh"
KINDS = {
    "Keyword": Indexed.KEYWORD,
    "KeywordList": Indexed.KEYWORD_LIST,
    "Bool": Indexed.BOOL,
}


def test_registration_script_is_the_generated_one() -> None:
    assert SCRIPT.read_text() == sa.registration_script(), (
        "regenerate: python -m relaunch.models.search_attributes > "
        "deploy/register-search-attributes.sh"
    )


def test_module_prints_the_script() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "relaunch.models.search_attributes"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert printed == sa.registration_script()


def test_script_registers_every_attribute_with_its_type() -> None:
    text = SCRIPT.read_text()
    for attr in sa.ALL:
        assert f"--name {attr.name} --type {attr.kind}\n" in text


def test_workflow_keys_follow_the_definitions() -> None:
    keys: list[SearchAttributeKey[Any]] = [
        workflow.SA_CLUSTER,
        workflow.SA_JOB,
        workflow.SA_CATEGORY,
        workflow.SA_STAGE,
        workflow.SA_MODE,
        workflow.SA_NODES,
        workflow.SA_AWAITING,
        workflow.SA_NODE_STAGE,
    ]
    assert [(k.name, k.indexed_value_type) for k in keys] == [
        (a.name, KINDS[a.kind]) for a in sa.ALL
    ]
    assert {a.name: a.kind for a in sa.ALL} == sa.SEARCH_ATTRIBUTES


def test_one_stage_enum() -> None:
    assert recovery.Stage is sa.Stage
    assert recovery.TERMINAL_STAGES is sa.TERMINAL_STAGES
    assert set(sa.Stage) >= sa.TERMINAL_STAGES
