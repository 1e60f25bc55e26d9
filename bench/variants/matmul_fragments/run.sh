#!/usr/bin/env bash
# Builds and runs the matmul probe on the GPU host (README.md here).
cd "$(dirname "$0")"
export PATH=$PATH:/usr/local/cuda/bin
nvcc -O3 -arch=sm_90 -std=c++17 -DWITH_CUBLAS -o /tmp/matmul_fragments probe.cu -lcublas 2>/dev/null || nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/matmul_fragments probe.cu
nvidia-smi --query-gpu=name --format=csv,noheader
/tmp/matmul_fragments
