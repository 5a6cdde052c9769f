#!/usr/bin/env bash
# Installs the Relaunch node agent on this node (as root): its token and the console's URL in
# /etc/relaunch/agent.env (root, 0600), the systemd unit relaunch-agent.service, then starts it.
# Relaunch must already be installed in the venv (deploy/README.md: /opt/relaunch/.venv).
#
#   deploy/install-agent.sh --url https://console.example:8400/intake/agent --token-file FILE
#       [--no-gpu] [--node NAME] [--venv /opt/relaunch/.venv] [--root DIR] [--no-start]
#
# The token comes from the console host: `relaunch console token NODE --role agent` prints it
# once; put it in a file only root may read, and give that file here (it is never an argument,
# which every user could read in ps). --root DIR writes under DIR instead of / and starts
# nothing (for a look at what it would write, or an image build).
set -euo pipefail

url="" token_file="" args="" venv=/opt/relaunch/.venv root="" start=1
while (($#)); do
  case $1 in
    --url) url=$2; shift 2 ;;
    --token-file) token_file=$2; shift 2 ;;
    --no-gpu) args+=" --no-gpu"; shift ;;
    --node) args+=" --node $2"; shift 2 ;;
    --venv) venv=$2; shift 2 ;;
    --root) root=$2; start=0; shift 2 ;;
    --no-start) start=0; shift ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $url =~ ^https?://[^[:space:]]+/intake/agent$ ]] || {
  echo "error: --url must be the console's http(s)://HOST:PORT/intake/agent" >&2; exit 2; }
[[ -n $token_file && -r $token_file ]] || {
  echo "error: --token-file must name a readable file holding this node's agent token" >&2; exit 2; }
token=$(tr -d '[:space:]' <"$token_file")
[[ $token =~ ^[A-Za-z0-9_-]{16,200}$ ]] || {
  echo "error: $token_file does not hold one token (rl_...)" >&2; exit 2; }
[[ $args =~ ^[[:space:]A-Za-z0-9._-]*$ ]] || { echo "error: invalid --node" >&2; exit 2; }
if [[ -z $root && $(id -u) -ne 0 ]]; then
  echo "error: run as root (it writes /etc/relaunch and /etc/systemd/system)" >&2; exit 1
fi
here=$(cd "$(dirname "$0")" && pwd)

install -d -m 0755 "$root/etc/relaunch" "$root/etc/systemd/system"
umask 077
env_file=$root/etc/relaunch/agent.env
tmp=$(mktemp "$root/etc/relaunch/.agent.env.XXXXXX")
printf 'RELAUNCH_AGENT_TOKEN=%s\nRELAUNCH_AGENT_POST=%s\nRELAUNCH_AGENT_ARGS=%s\n' \
  "$token" "$url" "${args# }" >"$tmp"
chmod 0600 "$tmp"
mv -f "$tmp" "$env_file"
sed "s|/opt/relaunch/.venv/bin/relaunch|$venv/bin/relaunch|" \
  "$here/systemd/relaunch-agent.service" >"$root/etc/systemd/system/relaunch-agent.service"
chmod 0644 "$root/etc/systemd/system/relaunch-agent.service"
echo "wrote $env_file (0600) and $root/etc/systemd/system/relaunch-agent.service"
if ((start)); then
  systemctl daemon-reload
  systemctl enable --now relaunch-agent.service
  systemctl --no-pager --lines=5 status relaunch-agent.service || true
fi
