"""Where a kernel's warps stall, by hot region of its SASS, from Nsight Compute's source page.

On the GPU machine:
  ncu --kernel-name regex:attention_bwd_dq --launch-skip 1 --launch-count 1 --section SourceCounters \\
      -f -o /tmp/dq python3 tools/profiling/profile_bwd.py --seqlen 8192 --case per-key
  ncu --import /tmp/dq.ncu-rep --page source --csv --print-source sass > dq.csv
Then anywhere: python3 tools/profiling/sass_stalls.py dq.csv [other.csv]

A region is a run of consecutive executed instructions; each line gives its instruction range,
its share of the stall samples, how often its busiest instruction ran, and its top stall
reasons; `--ops N` adds, under each region, its N opcodes with the most samples (the mnemonic
before its first '.', the predicate dropped) and their top stall reasons: which instructions a
region waits in, and on what (short_sb after a shuffle, wait after a fixed-latency op, ...).
With two files (the same kernel binary profiled on two inputs, say dense and with a bias),
regions are also compared by address: the largest differences in samples come last.
A file with several kernels (several launches profiled) is split at each "Kernel Name" line.
"""
import argparse
import csv


def read_kernels(path):
    """[(kernel name, [instruction dicts])] from one source-page CSV."""
    kernels, name, header, rows = [], None, None, []
    with open(path, newline="") as f:
        for rec in csv.reader(f):
            if not rec:
                continue
            if rec[0] == "Kernel Name":
                if header is not None:
                    kernels.append((name, rows))
                name, header, rows = rec[1], None, []
            elif header is None:
                header = {h: i for i, h in enumerate(rec)}
            else:
                def num(col):
                    i = header.get(col)
                    return int(rec[i] or 0) if i is not None and rec[i] not in ("", "-") else 0
                stalls = {h[len("stall_"):]: num(h) for h in header if h.startswith("stall_") and "Not Issued" not in h}
                rows.append({"source": rec[header["Source"]].strip(), "samples": num("Warp Stall Sampling (All Samples)"),
                             "executed": num("Instructions Executed"), "stalls": stalls})
    if header is not None:
        kernels.append((name, rows))
    return kernels


def regions(rows):
    """Runs of consecutive executed instructions: [(first, last)]."""
    out = []
    for i, r in enumerate(rows):
        if r["executed"] == 0:
            continue
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


def summarize(rows, first, last):
    seg = rows[first:last + 1]
    stalls = {}
    for r in seg:
        for k, v in r["stalls"].items():
            stalls[k] = stalls.get(k, 0) + v
    return sum(r["samples"] for r in seg), max(r["executed"] for r in seg), stalls


def opcode(source):
    """The mnemonic of one SASS line without predicate or modifiers: '@!P0 FMNMX.FTZ R1, ..' -> 'FMNMX'."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def by_opcode(rows, first, last):
    """[(opcode, samples, {stall: samples})] over rows first..last, most samples first."""
    acc = {}
    for r in rows[first:last + 1]:
        entry = acc.setdefault(opcode(r["source"]), [0, {}])
        entry[0] += r["samples"]
        for k, v in r["stalls"].items():
            entry[1][k] = entry[1].get(k, 0) + v
    return sorted(((op, n, st) for op, (n, st) in acc.items()), key=lambda x: -x[1])


def report(name, rows, top, ops=0):
    total = sum(r["samples"] for r in rows) or 1
    executed = sum(r["executed"] for r in rows)
    print(f"{name[:120]}\n  {len(rows)} instructions, {executed} executed (warp level), {total} stall samples")
    found = [(summarize(rows, a, b), a, b) for a, b in regions(rows)]
    found.sort(key=lambda x: -x[0][0])
    for (samples, most, stalls), a, b in found[:top]:
        reasons = sorted(stalls.items(), key=lambda kv: -kv[1])[:4]
        print(f"  [{a}-{b}] {b - a + 1:4d} instr  {100 * samples / total:5.1f}%  runs {most:9d}  " +
              " ".join(f"{k}={v}" for k, v in reasons))
        for op, n, st in by_opcode(rows, a, b)[:ops]:
            why = sorted(st.items(), key=lambda kv: -kv[1])[:3]
            print(f"      {op:<12} {100 * n / total:5.1f}%  " + " ".join(f"{k}={v}" for k, v in why))


def compare(rows_a, rows_b, top):
    """Samples per region of b against the same instruction range of a, largest growth last."""
    diffs = []
    for a, b in regions(rows_b):
        sb = summarize(rows_b, a, b)[0]
        sa = summarize(rows_a, a, min(b, len(rows_a) - 1))[0] if a < len(rows_a) else 0
        diffs.append((sb - sa, a, b, sa, sb))
    diffs.sort()
    print("  regions of the second file against the same range of the first (samples first -> second):")
    for d, a, b, sa, sb in diffs[-top:]:
        print(f"  [{a}-{b}] {sa} -> {sb} ({d:+d})  {rows_b[a]['source'][:60]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="+", help="one or two ncu source-page CSV files")
    ap.add_argument("--top", type=int, default=12, help="regions to print")
    ap.add_argument("--kernel", type=int, default=0, help="which kernel of each file (0 = the first)")
    ap.add_argument("--ops", type=int, default=0, help="opcodes to list under each region (0: none)")
    args = ap.parse_args()
    picked = []
    for path in args.csv[:2]:
        kernels = read_kernels(path)
        if args.kernel >= len(kernels):
            ap.error(f"{path}: {len(kernels)} kernel(s), no index {args.kernel}")
        name, rows = kernels[args.kernel]
        report(f"{path}: {name}", rows, args.top, args.ops)
        picked.append(rows)
    if len(picked) == 2:
        compare(picked[0], picked[1], args.top)


if __name__ == "__main__":
    main()
