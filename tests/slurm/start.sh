#!/usr/bin/env bash
# Starts a private single-node Slurm (slurmctld + slurmd on this machine) for tests of the
# scripts in scripts/slurm/. Everything lives under DIR: slurm.conf, state, spool, logs, pid
# files. Installs Debian's Slurm packages first when they are missing (root, or sudo).
#
#   tests/slurm/start.sh DIR          then: export SLURM_CONF=DIR/slurm.conf
#   tests/slurm/stop.sh DIR           stops the daemons again
#
# Env: K25_SLURM_CPUS  CPUs the node offers (default: nproc, at least 2 so 2-rank jobs fit).
# Ports are picked free at start so a second instance (CI next to a developer's) does not clash.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:?usage: $0 DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

# ---------------------------------------------------------------------------------------------
# Packages
# ---------------------------------------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null; then
    SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    echo "installing slurmctld slurmd slurm-client" >&2
    # The packages' scripts would start system daemons from /etc/slurm: a policy-rc.d that
    # refuses service starts (as container images have) keeps them off while installing.
    policy=
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
        $SUDO chmod +x /usr/sbin/policy-rc.d
        policy=1
    fi
    { $SUDO apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
            slurmctld slurmd slurm-client >&2; } || status=$?
    [ -z "$policy" ] || $SUDO rm -f /usr/sbin/policy-rc.d
    [ -z "${status:-}" ] || exit "$status"
fi

# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------
for f in slurmctld.pid slurmd.pid; do
    if [ -s "$dir/$f" ] && kill -0 "$(cat "$dir/$f")" 2>/dev/null; then
        echo "$0: a Slurm daemon from $dir is still running (pid $(cat "$dir/$f")); run tests/slurm/stop.sh $dir" >&2
        exit 1
    fi
done
rm -rf "$dir/state" "$dir/spool" "$dir/log"
mkdir -p "$dir/state" "$dir/spool" "$dir/log"

host=$(hostname -s)
cpus=${K25_SLURM_CPUS:-$(nproc)}
[ "$cpus" -ge 2 ] || cpus=2
# Two free TCP ports from the kernel (bound, then released for the daemons).
read -r ctld_port slurmd_port < <(python3 - <<'PY'
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("", 0))
print(*(s.getsockname()[1] for s in socks))
PY
)
sed -e "s|@DIR@|$dir|g" -e "s|@HOST@|$host|g" -e "s|@CPUS@|$cpus|g" \
    -e "s|@CTLD_PORT@|$ctld_port|g" -e "s|@SLURMD_PORT@|$slurmd_port|g" \
    "$here/slurm.conf.in" > "$dir/slurm.conf"
export SLURM_CONF=$dir/slurm.conf

# ---------------------------------------------------------------------------------------------
# Daemons (both fork into the background and write their pid files)
# ---------------------------------------------------------------------------------------------
dump_logs() {
    for l in "$dir"/log/*.log; do [ -f "$l" ] && { echo "--- $l" >&2; tail -20 "$l" >&2; }; done
}
slurmctld -c || { dump_logs; exit 1; }
slurmd || { dump_logs; exit 1; }

# The node is usable once the controller reports it idle.
state=
for _ in $(seq 1 60); do
    state=$(sinfo -h -N -o '%t' 2>/dev/null | head -1 || true)
    [ "$state" = idle ] && break
    sleep 0.5
done
if [ "$state" != idle ]; then
    echo "$0: node $host did not become idle (state '${state:-none}')" >&2
    sinfo -N -l >&2 || true
    dump_logs
    exit 1
fi
echo "slurm up: SLURM_CONF=$SLURM_CONF node $host cpus $cpus ports $ctld_port/$slurmd_port" >&2
