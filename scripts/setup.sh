#!/usr/bin/env bash
# Installs what k25dec needs to build and test on Debian 12 / Ubuntu 24.04:
# the Debian packages it links against and the Python packages its tests compare against.
# The CUDA toolkit (nvcc, cuBLASLt, NCCL) is not a Debian package; when it is present under
# CUDA_HOME the Makefile builds the CUDA backend too.
set -euo pipefail
SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
pkgs=(build-essential pkg-config
      libopenmpi-dev openmpi-bin     # MPI: ranks, tensor-parallel collectives on CPU, NCCL bootstrap
      libinih-dev                    # .ini configuration files
      libcjson-dev                   # config.json, safetensors headers, index files
      libpcre2-dev                   # the tokenizer's Unicode regular expression
      zlib1g-dev                     # CRC-32 of checkpoint shards (--verify)
      clang libclang-rt-dev          # libFuzzer + sanitizers for the parser fuzz targets
      procps                         # pgrep: tests/t_rank_kill.sh finds the ranks it signals
      python3 python3-pip)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Independent references the tests compare against: numpy (logit comparisons), safetensors
# (checkpoints written by the Hugging Face library), tiktoken (the reference tokenizer).
PIP="python3 -m pip"
$PIP install -q numpy safetensors tiktoken 2>/dev/null \
    || $PIP install -q --break-system-packages numpy safetensors tiktoken
