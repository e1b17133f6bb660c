#!/usr/bin/env bash
# Context parallelism on a machine with two GPUs or more, in one go: the library built for
# Hopper, the NCCL test of flash_dma.distributed against the one-process call, then
# bench_context_parallel.py under torchrun over every GPU (its table prints last) and the plot.
# NVLink multicast stays off (a program using it can take a shared host's GPUs out of service).
source "$(dirname "$0")/device_build.sh"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
device_build fdma
export FDMA_LIBRARY=$PWD/build/libfdma.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
GPUS=$(nvidia-smi -L | wc -l)
nvidia-smi -L
nvidia-smi topo -m >"$OUT/topo.log" 2>&1
python3 -m pytest tests/python/test_distributed.py --device cuda -q -k nccl >"$OUT/pytest.log" 2>&1
echo "pytest rc $?: $(tail -1 "$OUT/pytest.log")"
grep -E "^E |Error" "$OUT/pytest.log" | head -10
python3 -m torch.distributed.run --nproc_per_node "$GPUS" bench/bench_context_parallel.py \
  --tokens "${TOKENS:-1M,2M,4M}" --single "${SINGLE:-1M,2M}" --json "$OUT/cp.json" 2>&1 | tee "$OUT/bench.log" |
  grep -vE "^(W|I)[0-9]{4}" | tail -16
python3 bench/plot_context_parallel.py "$OUT/cp.json" "$OUT/cp.png" "${GPUS}x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" ||
  echo "no plot"
