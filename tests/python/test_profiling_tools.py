"""The profiling tools that ship as patches and readers: the patch still applies to the kernels
it instruments and leaves their wgmmas pipelined, the reader's phases are the differences of
the points it was given, the stall reader's regions and opcodes add up what it read, and the
launch table shows the pipe columns of the metrics a run asked for."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools", "profiling"))
import fwd_ws_timeline  # noqa: E402
import ncu_table  # noqa: E402
import sass_stalls  # noqa: E402


@pytest.mark.skipif(shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")),
                    reason="needs git and a checkout")
def test_timeline_patch_applies():
    r = subprocess.run(["git", "apply", "--check", "tools/profiling/fwd_ws_timeline.patch"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(shutil.which("git") is None or shutil.which("nvcc") is None
                    or not os.path.isdir(os.path.join(ROOT, ".git")), reason="needs git, nvcc and a checkout")
def test_timeline_patch_keeps_the_wgmmas_pipelined(tmp_path):
    # A printf (any call) inside a wgmma kernel makes ptxas serialize all its wgmmas (C7510):
    # the probe would then time another kernel. The patched D 128 bf16 forward must compile
    # without that warning.
    tree = tmp_path / "tree"
    archive = subprocess.run(["git", "archive", "HEAD", "src", "include"], cwd=ROOT, capture_output=True, check=True)
    tree.mkdir()
    subprocess.run(["tar", "-x"], cwd=tree, input=archive.stdout, check=True)
    patch = os.path.abspath(os.path.join(ROOT, "tools", "profiling", "fwd_ws_timeline.patch"))
    subprocess.run(["git", "apply", patch], cwd=tree, check=True)
    unit = tree / "fwd128.cu"
    unit.write_text('#include "cuda/attention/attention_fwd.cuh"\n'
                    "FDMA_INSTANTIATE_ATTENTION_FWD(__nv_bfloat16, 128)\n")
    r = subprocess.run(["nvcc", "-std=c++17", "-O3", "--expt-relaxed-constexpr", "-DFDMA_BUILDING_LIBRARY",
                        "-DFDMA_HAVE_CUDA=1", "-Iinclude", "-Isrc", "-gencode", "arch=compute_90a,code=sm_90a",
                        "-cubin", "-o", "fwd128.cubin", "fwd128.cu"], cwd=tree, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "C7510" not in r.stdout + r.stderr, "the probe serializes the forward's wgmmas"


def test_timeline_reader_phases(capsys):
    # One CTA of 5 tiles; group g's step j starts at 10000 j + 100 g and its points are 10 apart,
    # but for the issue phase (point 3 -> 4), 500 long.
    lines = ["CALL 0 1.0 ms"]
    for g in range(2):
        for j in range(24):
            start = 10000 * j + 100 * g
            pts = [start + 10 * k + (490 if k >= 4 else 0) for k in range(8)]
            lines.append(f"T 0 {g} {j} 5 " + " ".join(str(p) for p in pts))
    lines.append("CALL 1 1.0 ms")
    fwd_ws_timeline.report("\n".join(lines))
    out = capsys.readouterr().out
    medians = {line[:32].strip(): line[32:].split()[0] for line in out.splitlines() if line.startswith("  ")
               and not line.lstrip()[0].isdigit()}
    assert medians["K wait"] == "10"
    assert medians["issue"] == "500"
    assert medians["group 1 issues after group 0"] == "100"
    assert medians["group 0's period"] == "10000"


def test_stall_reader_regions_and_opcodes(tmp_path, capsys):
    # Nsight Compute's source page as CSV: two runs of executed instructions split by one that
    # never ran, with predicated and modified mnemonics.
    head = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_wait",
            "stall_short_sb", "stall_wait (Not Issued)"]
    body = [["0x0", "FMNMX R1, R2, R3", "30", "8", "10", "20", "9"],
            ["0x10", "@!P0 FMNMX.FTZ R4, R1, R5", "10", "8", "10", "0", "9"],
            ["0x20", "MUFU.EX2 R6, R4", "5", "8", "5", "0", "9"],
            ["0x30", "EXIT", "0", "0", "0", "0", "0"],
            ["0x40", "@P1 BRA 0x0", "55", "100", "0", "55", "0"]]
    path = tmp_path / "src.csv"
    path.write_text("\n".join(",".join(f'"{c}"' for c in rec) for rec in
                              [["Kernel Name", "k"], head] + body) + "\n")
    (name, rows), = sass_stalls.read_kernels(str(path))
    assert name == "k" and len(rows) == 5
    assert sass_stalls.regions(rows) == [[0, 2], [4, 4]]
    ops = sass_stalls.by_opcode(rows, 0, 2)
    assert [(op, n) for op, n, _ in ops] == [("FMNMX", 40), ("MUFU", 5)]
    assert ops[0][2] == {"wait": 20, "short_sb": 20}  # the Not Issued columns are not counted again
    sass_stalls.report("k", rows, top=2, ops=1)
    out = capsys.readouterr().out
    assert "[4-4]" in out.splitlines()[2] and "55.0%" in out.splitlines()[2]
    assert out.splitlines()[3].split()[:2] == ["BRA", "55.0%"]
    assert out.splitlines()[4].startswith("  [0-2]") and "45.0%" in out.splitlines()[4]
    assert out.splitlines()[5].split()[:2] == ["FMNMX", "40.0%"]


def test_launch_table_pipes(tmp_path, capsys, monkeypatch):
    # Nsight Compute's details page as CSV, the profiled program's own output between its lines:
    # two launches, the second with the pipe metrics asked for. A file without them keeps the
    # columns it had; with them, each pipe's use sits in its own column.
    def page(records):
        head = ["ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]
        return "\n".join(",".join(f'"{c}"' for c in rec) for rec in [head] + records) + "\n"
    base = [["0", "k0(int)", "SOL", "Duration", "us", "10.00"], ["1", "k1(int)", "SOL", "Duration", "ns", "2,000"]]
    pipes = [["1", "k1(int)", "", metric, "%", value]
             for (_, metric), value in zip(ncu_table.PIPES, ["60.1", "29.3", "28.4", "11.9"])]
    plain, piped = tmp_path / "plain.csv", tmp_path / "piped.csv"
    plain.write_text(page(base))
    piped.write_text("program output\n" + page(base + pipes))
    monkeypatch.setattr(sys, "argv", ["ncu_table.py", str(plain), str(piped)])
    ncu_table.main()
    out = capsys.readouterr().out.splitlines()
    assert "tensor %" not in out[1] and out[1].count("|") == len(ncu_table.COLUMNS) + 3
    assert out[3].startswith("| k0 | 10.0 |")
    header = out[6].split(" | ")
    assert header[-5:-1] == ["tensor %", "XU %", "ALU %", "FMA %"]
    rows = {line.split(" | ")[0]: line.split(" | ") for line in out[8:]}
    assert rows["| k1"][1] == "2.0" and rows["| k1"][-5:-1] == ["60.1", "29.3", "28.4", "11.9"]
    assert rows["| k0"][-5:-1] == ["", "", "", ""]
    monkeypatch.setattr(sys, "argv", ["ncu_table.py", "--pipe-metrics"])
    ncu_table.main()
    assert capsys.readouterr().out.strip().split(",") == [m for _, m in ncu_table.PIPES]


def test_tile_list_checkpoints_hold_every_listed_key():
    # The simulators' causal top-w intervals keep exactly min(w, i + 1) keys at each query i,
    # and a checkpoint list (the kept keys before the checkpoint's row still alive there) with
    # the kept keys from that row on holds every key a tile after it lists, as
    # simulate_tile_lists.scanned_candidates counts them.
    np = pytest.importorskip("numpy")
    import simulate_dkdv_groups
    import simulate_tile_lists
    S, w, block_m, every = 700, 40, 16, 2
    begin, end = simulate_dkdv_groups.causal_intervals(np.random.default_rng(4).standard_normal(S), w)
    for i in range(S):
        assert int(((begin <= i) & (i < end)).sum()) == min(w, i + 1)
    kept = [j for j in range(S) if end[j] > begin[j]]
    now = tiles = ckpts = largest = 0
    longest = (0, 0, 0)
    for t in range(-(-S // block_m)):
        lo, hi = t * block_m, min(S, (t + 1) * block_m)
        c = t // every * every * block_m
        listed = {j for j in kept if begin[j] < hi and end[j] > lo}
        ckpt = {j for j in kept if j < c and end[j] > c}
        since = {j for j in kept if c <= j < hi}
        assert listed <= ckpt | since
        now += sum(j < hi for j in kept)
        tiles += len(ckpt) + len(since)
        ckpts += sum(j < c for j in kept) if t % every == 0 else 0
        largest = max(largest, len(ckpt))
        scans = (sum(j < hi for j in kept), sum(j < c for j in kept), len(ckpt) + len(since))
        longest = tuple(max(a, b) for a, b in zip(longest, scans))
    assert simulate_tile_lists.scanned_candidates(begin, end, block_m, every) == ((now, tiles, ckpts, largest), longest)
    assert longest[2] < longest[1] < longest[0]  # a tile scans more than its checkpoint: its own rows
    assert largest <= w and tiles + ckpts < now
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "profiling", "simulate_tile_lists.py"),
                        "--seqlens", "600", "--w", "40", "--checkpoints", "2"], capture_output=True, text=True)
    assert r.returncode == 0 and "x fewer" in r.stdout, r.stderr


def test_walk_hits_are_the_kept_keys_past_rank_w():
    # A step's hits (keys whose index lies below x, the w-th smallest index ranked before them)
    # against their definition, walked key by key in rank order; a piece's weight sums its steps'.
    np = pytest.importorskip("numpy")
    import simulate_walk_pieces
    S, w = 900, 50
    scores = np.random.default_rng(6).standard_normal(S)
    order = np.lexsort((np.arange(S), -scores))
    hits = np.zeros(S, bool)
    for t in range(w, S):
        x = np.sort(order[:t])[w - 1]
        hits[t] = order[t] < x
    nh = simulate_walk_pieces.step_hits(scores, w)
    padded = np.zeros(-(-S // 32) * 32, bool)
    padded[:S] = hits
    assert nh.tolist() == padded.reshape(-1, 32).sum(1).tolist()
    assert nh[: w // 32].sum() == 0 and nh.sum() > 0
    one = simulate_walk_pieces.piece_weights(nh, w, 32)
    assert simulate_walk_pieces.piece_weights(nh, w, 64).tolist() == [int(one[i:i + 2].sum()) for i in range(0, len(one), 2)]
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "profiling", "simulate_walk_pieces.py"),
                        "--seqlen", "2000", "--w", "100"], capture_output=True, text=True)
    assert r.returncode == 0 and "heaviest" in r.stdout, r.stderr
