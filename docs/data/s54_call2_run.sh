#!/usr/bin/env bash
# Session 54, call 2: issue 4's figures on main (0c2cace's code: the kernels of 757fcb3), `device_dist_checks.sh
# speed`: bench_attention beside PyTorch's SDPA, bench_grouped_gemm 8x7B beside cuBLASLt, and the trainer beside HF
# for 8x1B, 8x7B 2 layers and L0_sanity. bins.tgz: `bash scripts/pack_devbin.sh --only
# mxtrain_tests,bench_grouped_gemm,bench_attention devbin/bins.tgz main=build`.
set -u
mkdir -p m && tar xzf devbin/bins.tgz -C m
cat m/main/VERSION
OUT=$OUT/speed timeout 580 bash scripts/device_dist_checks.sh m/main speed 2>&1 | tail -60
