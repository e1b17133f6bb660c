#!/usr/bin/env bash
# Nsight Compute over the dynamic-mask kernels on a GPU machine: build for Hopper, then per
# kernel launch the speed-of-light, scheduler, occupancy and pipe figures and the bf16 tensor ops of
# the causal top-w forward and backward (B1 H16 Hk4 D128 w2048 at 16K, and the seed config
# H2 Hk1 D64 w1024 at 32K), the dense forward beside them (profile_fwd.py, 16K), and the
# gathered forward's stall samples by SASS region. CSVs go to $OUT; tables print last.
source "$(dirname "$0")/../../bench/device_build.sh"
device_build fdma
export FDMA_LIBRARY=$PWD/build/libfdma.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
NCU=${NCU:-/usr/local/cuda/bin/ncu}
SECTIONS=(--section SpeedOfLight --section SchedulerStats --section Occupancy --section LaunchStats
  --metrics "sm__ops_path_tensor_src_bf16_dst_fp32.sum,$(python3 tools/profiling/ncu_table.py --pipe-metrics)")
profile() {  # name, then the profiled program's arguments
  local name=$1
  shift
  timeout 300 "$NCU" "${SECTIONS[@]}" --csv --page details "$@" >"$OUT/$name.csv" 2>"/tmp/$name.err" ||
    { echo "$name: ncu failed"; tail -5 "/tmp/$name.err"; }
}
profile dma16k python3 tools/profiling/profile_dma.py --seqlen 16384
profile seed32k python3 tools/profiling/profile_dma.py --heads 2 --kv-heads 1 --headdim 64 --window 1024 --seqlen 32768
profile dense16k --kernel-name regex:attention_fwd python3 tools/profiling/profile_fwd.py --seqlen 16384
if [ "${STALLS:-1}" = 1 ]; then
  timeout 300 "$NCU" --kernel-name regex:attention_fwd_ws --launch-count 1 --section SourceCounters -f -o /tmp/fwdsrc \
    python3 tools/profiling/profile_dma.py --seqlen 16384 --forward-only >/tmp/fwdsrc.err 2>&1 &&
    "$NCU" --import /tmp/fwdsrc.ncu-rep --page source --csv --print-source sass >"$OUT/fwd_ws_gathered_sass.csv" &&
    python3 tools/profiling/sass_stalls.py "$OUT/fwd_ws_gathered_sass.csv" >"$OUT/fwd_ws_gathered_stalls.txt" 2>&1 ||
    tail -5 /tmp/fwdsrc.err
  head -40 "$OUT/fwd_ws_gathered_stalls.txt"
fi
python3 tools/profiling/ncu_table.py "$OUT"/dma16k.csv "$OUT"/seed32k.csv "$OUT"/dense16k.csv
