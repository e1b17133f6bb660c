"""One line per profiled kernel launch from Nsight Compute's details page, for a run's log.

On the GPU machine:
  ncu --section SpeedOfLight --section SchedulerStats --section Occupancy --section LaunchStats \\
      --metrics sm__ops_path_tensor_src_bf16_dst_fp32.sum,$(python3 tools/profiling/ncu_table.py --pipe-metrics) \\
      --csv --page details python3 tools/profiling/profile_dma.py --seqlen 16384 > dma.csv
Then anywhere: python3 tools/profiling/ncu_table.py dma.csv
Columns: duration (us), achieved tensor TF/s (bf16 ops over the duration, where the metric was
asked for), SM and memory throughput (% of peak), issue slots busy (%), eligible warps per
scheduler, registers per thread, grid size; and where the pipe metrics were asked for, how busy
the tensor, XU (MUFU: exponentials), ALU and FMA pipes were while the SMs were active (% of
peak): which pipe, if any, a kernel saturates.
"""
import argparse
import csv

COLUMNS = [  # (header, metric name as the details page spells it)
    ("us", "Duration"),
    ("SM %", "Compute (SM) Throughput"),
    ("mem %", "Memory Throughput"),
    ("L2 %", "L2 Cache Throughput"),
    ("DRAM %", "DRAM Throughput"),
    ("issue %", "Issue Slots Busy"),
    ("eligible", "Eligible Warps Per Scheduler"),
    ("regs", "Registers Per Thread"),
    ("grid", "Grid Size"),
]
TENSOR_OPS = "sm__ops_path_tensor_src_bf16_dst_fp32.sum"
PIPES = [  # (header, metric): each pipe's use while the SM is active, % of its peak
    ("tensor %", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"),
    ("XU %", "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"),
    ("ALU %", "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active"),
    ("FMA %", "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"),
]


def read_launches(path):
    """[(kernel name, {metric: (unit, value)})] in launch order."""
    launches, index = [], {}
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # the program's own output is not CSV
    for rec in csv.DictReader(lines):
        key = rec.get("ID")
        if key not in index:
            index[key] = len(launches)
            launches.append((rec.get("Kernel Name", "?"), {}))
        launches[index[key]][1][rec["Metric Name"]] = (rec.get("Metric Unit", ""), rec.get("Metric Value", ""))
    return launches


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def duration_us(unit, value):
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit, 1.0)
    v = number(value)
    return None if v is None else v * scale


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="*")
    ap.add_argument("--name-width", type=int, default=64)
    ap.add_argument("--pipe-metrics", action="store_true", help="print the pipe metrics' names for ncu --metrics")
    args = ap.parse_args()
    if args.pipe_metrics:
        print(",".join(metric for _, metric in PIPES))
        return
    if not args.csv:
        ap.error("give one or more details-page CSV files (or --pipe-metrics)")
    for path in args.csv:
        launches = read_launches(path)
        pipes = [(h, m) for h, m in PIPES if any(m in metrics for _, metrics in launches)]
        print(f"## {path}")
        print("| kernel | " + " | ".join(h for h, _ in COLUMNS + pipes) + " | tensor TF/s |")
        print("|---" * (len(COLUMNS) + len(pipes) + 2) + "|")
        for name, metrics in launches:
            cells = []
            for header, metric in COLUMNS:
                unit, value = metrics.get(metric, ("", ""))
                if header == "us":
                    us = duration_us(unit, value)
                    cells.append("" if us is None else f"{us:.1f}")
                else:
                    cells.append(value)
            cells += [metrics.get(metric, ("", ""))[1] for _, metric in pipes]
            ops = number(metrics.get(TENSOR_OPS, ("", ""))[1])
            us = duration_us(*metrics.get("Duration", ("", "")))
            tfs = f"{ops / (us * 1e6):.0f}" if ops and us else ""
            short = name.split("(")[0][: args.name_width]
            print(f"| {short} | " + " | ".join(cells) + f" | {tfs} |")


if __name__ == "__main__":
    main()
