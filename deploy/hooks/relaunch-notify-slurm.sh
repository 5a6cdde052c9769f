#!/bin/sh
# relaunch-notify-slurm.sh: tell the Relaunch console about a Slurm event, at once, instead of
# waiting for the watcher's next poll. It POSTs {"event", "node", "job_id", "state", "time"} to
# the console's /intake/slurm with an intake token (`relaunch console` tokens, role "intake").
#
#   strigger (on the controller, as SlurmUser):
#     strigger --set --down --flags=perm --program=/usr/local/sbin/relaunch-notify-slurm.sh
#     strigger --set --fail --flags=perm --program=/usr/local/sbin/relaunch-notify-slurm-fail
#       (a symlink to this script: a name ending in "-fail" posts node_fail; strigger passes the
#       nodes as a hostlist in $1)
#   Epilog or EpilogSlurmctld (slurm.conf):  Epilog=/usr/local/sbin/relaunch-notify-slurm.sh
#       (no argument and SLURM_JOB_ID set: job_end; the state comes from SLURM_JOB_EXIT_CODE
#       where Slurm sets it, else it is left out and the console only records the event)
#   By hand:  relaunch-notify-slurm.sh node_down|node_fail NODE   or   job_end JOBID [STATE]
#
# Settings (environment, or /etc/relaunch/notify-slurm.env, a root-owned file sourced if present):
#   RELAUNCH_INTAKE_URL         the console, default http://127.0.0.1:8400
#   RELAUNCH_INTAKE_TOKEN_FILE  the token, default /etc/relaunch/intake.token; it must be readable
#                               by its owner only (chmod 600), or this script refuses to send it
#
# It never fails the caller (a failing Epilog drains the node): errors go to syslog and stderr,
# and the exit status is 0. curl retries on connection errors, 429 and 5xx.
set -u

conf=${RELAUNCH_NOTIFY_CONF:-/etc/relaunch/notify-slurm.env}
# shellcheck disable=SC1090
[ -r "$conf" ] && . "$conf"
url=${RELAUNCH_INTAKE_URL:-http://127.0.0.1:8400}
token_file=${RELAUNCH_INTAKE_TOKEN_FILE:-/etc/relaunch/intake.token}

say() {
    command -v logger >/dev/null 2>&1 && logger -t relaunch-notify-slurm -- "$*"
    echo "relaunch-notify-slurm: $*" >&2
}

# Names go into JSON and a URL: only what Slurm allows in node names and job ids.
safe() {
    case $1 in
        '' | *[!A-Za-z0-9._-]*) return 1 ;;
        *) return 0 ;;
    esac
}

post() { # event node job_id state
    body="{\"event\":\"$1\""
    [ -n "$2" ] && body="$body,\"node\":\"$2\""
    [ -n "$3" ] && body="$body,\"job_id\":\"$3\""
    [ -n "$4" ] && body="$body,\"state\":\"$4\""
    body="$body,\"time\":\"$(date -u +%Y-%m-%dT%H:%M:%SZ)\"}"
    headers=$(mktemp) || return 1
    # The token goes to curl in a file, never on a command line (ps shows arguments).
    printf 'Authorization: Bearer %s\nContent-Type: application/json\n' "$token" >"$headers"
    answer=$(curl -sS --max-time 10 --retry 5 --retry-connrefused --retry-max-time 60 \
        -o /dev/stdout -w ' HTTP %{http_code}' -H "@$headers" --data-binary "$body" \
        "$url/intake/slurm" 2>&1)
    rc=$?
    rm -f "$headers"
    case $answer in
        *' HTTP 200') return 0 ;;
    esac
    say "posting $1 ${2:-} ${3:-} failed (curl $rc): $answer"
    return 1
}

main() {
    umask 077
    if [ ! -r "$token_file" ]; then
        say "cannot read the intake token file $token_file"
        return 1
    fi
    if [ -n "$(find "$token_file" -perm /077 2>/dev/null)" ]; then
        say "$token_file is readable by others: chmod 600 it (not sending)"
        return 1
    fi
    token=$(cat "$token_file")

    event=${1:-}
    case $event in
        node_down | node_fail | job_end) shift ;;
        '')
            if [ -n "${SLURM_JOB_ID:-}" ]; then event=job_end; else
                say "no event: pass node_down|node_fail|job_end, or run as an Epilog"
                return 1
            fi
            ;;
        *) # strigger: $1 is the hostlist; the script's name says which trigger
            case $0 in *-fail) event=node_fail ;; *) event=node_down ;; esac ;;
    esac

    if [ "$event" = job_end ]; then
        job=${1:-${SLURM_JOB_ID:-}}
        state=${2:-}
        if [ -z "$state" ] && [ -n "${SLURM_JOB_EXIT_CODE:-}" ]; then
            if [ "$SLURM_JOB_EXIT_CODE" = 0 ]; then state=COMPLETED; else state=FAILED; fi
        fi
        node=${SLURMD_NODENAME:-}
        safe "$job" || { say "invalid job id '$job'"; return 1; }
        [ -z "$node" ] || safe "$node" || node=
        [ -z "$state" ] || safe "$state" || state=
        post job_end "$node" "$job" "$state"
        return
    fi

    hosts=${1:-}
    [ -n "$hosts" ] || { say "$event: no node given"; return 1; }
    if command -v scontrol >/dev/null 2>&1; then
        nodes=$(scontrol show hostnames "$hosts" 2>/dev/null) || nodes=$hosts
    else
        nodes=$hosts
    fi
    status=0
    for node in $(echo "$nodes" | tr ',' ' '); do
        if safe "$node"; then post "$event" "$node" "" "" || status=1; else
            say "invalid node name '$node'"
            status=1
        fi
    done
    return $status
}

main "$@" || true
exit 0
