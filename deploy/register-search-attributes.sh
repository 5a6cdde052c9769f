#!/usr/bin/env bash
# Registers Relaunch's search attributes on a Temporal cluster (the dev stack does this itself).
# Usage: TEMPORAL_ADDRESS=host:7233 deploy/register-search-attributes.sh [namespace]
set -euo pipefail
ns=${1:-default}
declare -A attrs=(
  [RelaunchCluster]=Keyword [RelaunchJobId]=Keyword [RelaunchCategory]=Keyword
  [RelaunchStage]=Keyword [RelaunchMode]=Keyword [RelaunchNodes]=KeywordList
  [RelaunchAwaitingApproval]=Bool
)
for name in "${!attrs[@]}"; do
  temporal operator search-attribute create --namespace "$ns" --name "$name" --type "${attrs[$name]}"
done
