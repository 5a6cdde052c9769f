"""Names and types of the Temporal search attributes Relaunch sets (the design's contract).

Kept as plain data so that this package stays free of temporalio; the workflow layer builds
typed keys from it, and the dev stack and deploy scripts register it.
"""

from __future__ import annotations

SEARCH_ATTRIBUTES: dict[str, str] = {
    "RelaunchCluster": "Keyword",
    "RelaunchJobId": "Keyword",
    "RelaunchCategory": "Keyword",
    "RelaunchStage": "Keyword",
    "RelaunchMode": "Keyword",
    "RelaunchNodes": "KeywordList",
    "RelaunchAwaitingApproval": "Bool",
}
