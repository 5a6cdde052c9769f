#!/usr/bin/env bash
# Installs what Relaunch needs on a fresh Debian/Ubuntu machine (as root): the Slurm and munge
# Debian packages when missing, then a virtual environment with the project and its tools.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(slurmctld slurmd slurm-client slurmrestd munge curl openssh-server openssh-client)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "error: missing Debian packages: ${missing[*]} — run as root, or install them first" >&2
    exit 1
  fi
  echo "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

python=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  echo "creating .venv"
  "$python" -m venv .venv
fi
stamp=.venv/.relaunch-installed
if [[ ! -f $stamp || pyproject.toml -nt $stamp ]]; then
  echo "installing Python packages into .venv"
  .venv/bin/pip install -q --disable-pip-version-check -e '.[dev,examples]'
  touch "$stamp"
fi
