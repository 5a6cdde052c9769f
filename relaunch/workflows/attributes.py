"""The search attributes Relaunch's workflows set (relaunch/models/search_attributes.py names
them and registers them with the server), as the SDK's typed keys."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey, SearchAttributeUpdate

with workflow.unsafe.imports_passed_through():
    from relaunch.models import search_attributes as sa
    from relaunch.models.recovery import Stage


def _keyword(attr: sa.SearchAttribute) -> SearchAttributeKey[str]:
    assert attr.kind == "Keyword", attr
    return SearchAttributeKey.for_keyword(attr.name)


SA_CLUSTER = _keyword(sa.CLUSTER)
SA_JOB = _keyword(sa.JOB_ID)
SA_CATEGORY = _keyword(sa.CATEGORY)
SA_STAGE = _keyword(sa.STAGE)
SA_MODE = _keyword(sa.MODE)
assert sa.NODES.kind == "KeywordList"
SA_NODES = SearchAttributeKey.for_keyword_list(sa.NODES.name)
assert sa.AWAITING_APPROVAL.kind == "Bool"
SA_AWAITING = SearchAttributeKey.for_bool(sa.AWAITING_APPROVAL.name)
SA_NODE_STAGE = _keyword(sa.NODE_STAGE)  # a node lifecycle's own stage


def stage_attributes(stage: Stage) -> list[SearchAttributeUpdate[Any]]:
    """The search attributes a recovery or a node decision upserts on entering ``stage``."""
    return [
        SA_STAGE.value_set(stage.value),
        SA_AWAITING.value_set(stage is Stage.AWAITING_APPROVAL),
    ]
