#!/usr/bin/env python3
"""Draws docs/performance.md's tables as plots: time per call against size,
for each op, ours against torch and against the limit where the data has
one. Writes docs/img/*.png.

    python3 bench/plot_performance.py            # every figure into docs/img/
    python3 bench/plot_performance.py --out DIR  # elsewhere

Sources, all committed (nothing is measured here):
  - bench/results/*.csv   dps-perf --csv runs (comment lines start with '#');
  - bench/results/*.txt   dps-perf table output and bench/compare_torch.py
                          output of the same session, one file per run;
  - docs/performance.md   the tables whose raw runs were never committed
                          (bench/results/README.md: the transports' runs and
                          the torch comparison of argmax / top-k predate that
                          folder); each figure names its source.

The limit is the read-bandwidth time where a run measured the HBM read peak
(dps-perf's "HBM read peak" line): the shard's bytes / that peak, the time a
pass that only reads the logits once would take. For the swap it is the
bytes sent / the peer-store peak of the same run (docs/performance.md's
default-run table gives both as the "onesided link" share). The gathers move
a few KiB; no limit is drawn for them.

Needs matplotlib (pip install matplotlib); without it the script says so and
exits with status 2.
"""

import argparse
import csv
import io
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
PERF_MD = os.path.join(ROOT, "docs", "performance.md")


# ---- parsers ---------------------------------------------------------------------


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def hbm_peak_gbps(text):
    """The HBM read peak (GB/s) dps-perf measured in a run, or None."""
    m = re.search(r"^# HBM read peak: ([0-9.]+) GB/s", text, re.M)
    return float(m.group(1)) if m else None


def dps_perf_csv(path):
    """Rows of a dps-perf --csv run (dicts with numeric fields converted)."""
    text = _read(path)
    body = "\n".join(line for line in text.splitlines() if line and not line.startswith("#"))
    rows = []
    for r in csv.DictReader(io.StringIO(body)):
        rows.append(
            dict(op=r["op"], backend=r["backend"], pad_bs=int(r["pad_bs"]), n=int(r["N"]),
                 vocab=r["vocab"], bytes=int(r["bytes"]), time_us=float(r["time_us"]),
                 status=r["status"]))
    return rows, hbm_peak_gbps(text)


def dps_perf_tables(text):
    """Rows of every dps-perf table in a text file (the lines after a
    '#  op  backend  pad_bs ...' header up to the next comment line)."""
    rows, on = [], False
    for line in text.splitlines():
        if re.match(r"^#\s+op\s+backend\s+pad_bs", line):
            on = True
            continue
        if not line.strip() or line.startswith("#"):
            on = False if line.startswith("#") else on
            continue
        if on:
            f = line.split()
            if len(f) >= 11:
                rows.append(dict(op=f[0], backend=f[1], pad_bs=int(f[2]), n=int(f[3]),
                                 vocab=f[4], bytes=int(f[6]), time_us=float(f[7])))
    return rows


def compare_torch_tables(text, kind):
    """Rows of bench/compare_torch.py's table of `kind` ('sample', 'verify'):
    dicts keyed by the header's column names (numbers converted)."""
    rows, cols = [], None
    for line in text.splitlines():
        m = re.match(r"^#\s+%s\s+shape\s+case\s+(.*)$" % kind, line)
        if m:
            cols = line[1:].split("   (")[0].split()
            continue
        if cols is None:
            continue
        if line.startswith("#") or not line.strip():
            cols = None if line.startswith("#") else cols
            continue
        f = line.split()
        if f[0] != kind or len(f) < len(cols):
            continue
        r = {}
        for c, v in zip(cols, f):
            try:
                r[c] = float(v)
            except ValueError:
                r[c] = v
        rows.append(r)
    return rows


def md_table(text, heading, nth=0):
    """The nth markdown table after `heading` in docs/performance.md, as a
    list of dicts keyed by the header cells."""
    i = text.index(heading)
    lines = text[i:].splitlines()
    tables, cur = [], None
    for line in lines[1:]:
        if line.startswith("## ") and tables:
            break
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cur is None:
                cur = {"head": cells, "rows": []}
            elif not set("".join(cells)) <= set("-: "):
                cur["rows"].append(dict(zip(cur["head"], cells)))
        elif cur is not None:
            tables.append(cur)
            cur = None
            if len(tables) > nth:
                break
    if cur is not None:
        tables.append(cur)
    return tables[nth]["rows"]


def num(s):
    return float(re.sub(r"[^0-9.eE+-]", "", s))


# ---- figures ---------------------------------------------------------------------


def _style(ax, title, xlabel):
    ax.set_title(title, fontsize=9)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel("µs per call", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7)


def _save(fig, out, name, source):
    fig.text(0.01, 0.01, source, fontsize=6, color="0.35", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    path = os.path.join(out, name)
    fig.savefig(path, dpi=90)
    import matplotlib.pyplot as plt

    plt.close(fig)
    print("wrote %s (%d bytes)" % (os.path.relpath(path, ROOT), os.path.getsize(path)))


def fig_select(plt, out):
    """argmax, argmax + logsumexp, top-64 at tp=1: ours (the rows sweep),
    torch (docs table), the read limit."""
    path = os.path.join(RESULTS, "2026-12-01-h200-1814e93-select-rows.csv")
    rows, peak = dps_perf_csv(path)
    torch_rows = md_table(_read(PERF_MD), "## Selection without moving the logits", nth=2)
    torch = {}
    for r in torch_rows:
        n = int(r["rows × V"].split("×")[0])
        torch[(r["op"], n)] = num(r["torch µs"])
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.1))
    for ax, op, title, tname in zip(axes, ["argmax", "argmax_lse", "topk"],
                                    ["dpsArgmax", "dpsArgmax + logsumexp", "dpsTopK, k = 64"],
                                    ["argmax", None, "top-64"]):
        pts = sorted((r["pad_bs"] * r["n"], r["time_us"], r["bytes"]) for r in rows
                     if r["op"] == op and r["status"] == "ok")
        x = [p[0] for p in pts]
        ax.plot(x, [p[1] for p in pts], "o-", label="dpsampling (onesided)")
        ax.plot(x, [p[2] / (peak * 1e3) for p in pts], "k--",
                label="read limit (%.0f GB/s)" % peak)
        if tname:
            tp = sorted((n, t) for (o, n), t in torch.items() if o == tname)
            ax.plot([p[0] for p in tp], [p[1] for p in tp], "s-", color="C3",
                    label="torch (%s)" % ("torch.argmax" if op == "argmax" else "torch.topk"))
        _style(ax, title, "rows (bf16, V = 76032; 8 rows: 64640)")
    _save(fig, out, "perf-select.png",
          "one H200, tp=1. dpsampling: bench/results/2026-12-01-h200-1814e93-select-rows.csv; "
          "torch: docs/performance.md (ce5d297, no raw run committed)")


def _sample_figure(plt, out, text, cases, name, source):
    """dpsSample at tp=1 from one session's dps-perf and compare_torch.py
    output: ours, torch's sampler (vLLM V1 on the full row), the read limit;
    cases = (compare_torch case, dps-perf op, title) per panel."""
    peak = hbm_peak_gbps(text)
    ours = dps_perf_tables(text)
    cmp_rows = compare_torch_tables(text, "sample")
    fig, axes = plt.subplots(1, len(cases), figsize=(10, 3.1))
    for ax, (case, op, title) in zip(axes, cases):
        pts = sorted((r["pad_bs"] * r["n"], r["time_us"], r["bytes"]) for r in ours if r["op"] == op)
        x = [p[0] for p in pts]
        ax.plot(x, [p[1] for p in pts], "o-", label="dpsampling (dps-perf)")
        tc = sorted((int(r["shape"].split("x")[0]), r["torch(us)"]) for r in cmp_rows
                    if r["case"] == case)
        ax.plot([p[0] for p in tc], [p[1] for p in tc], "s-", color="C3", label="torch sampler")
        ax.plot(x, [p[2] / (peak * 1e3) for p in pts], "k--", label="read limit (%.0f GB/s)" % peak)
        _style(ax, "dpsSample, " + title, "rows (bf16, V = 152064)")
    _save(fig, out, name, source)


_SAMPLE_T_KP = [("t", "sample_t", "temperature 0.7"), ("kp", "sample_kp", "top-k 50 + top-p 0.9")]


def fig_sample(plt, out):
    """dpsSample as of 2026-12-01 (temperature, top-k + top-p, min-p)."""
    text = _read(os.path.join(RESULTS, "2026-12-01-h200-60f61fb-sample.txt"))
    _sample_figure(plt, out, text, _SAMPLE_T_KP + [("minp", "sample_minp", "min-p 0.1")],
                   "perf-sample.png",
                   "one H200, tp=1, onesided: bench/results/2026-12-01-h200-60f61fb-sample.txt "
                   "(dps-perf and compare_torch.py, one session)")


def fig_sample_s28(plt, out):
    """dpsSample as of session 28 (main bc1ae4c; temperature, top-k + top-p,
    top-p alone): run 4 of that session's file, whose lines carry a 'run4 '
    prefix."""
    path = os.path.join(RESULTS, "2026-12-04-h200-s28-experiments.txt")
    text = "\n".join(line[len("run4 "):] for line in _read(path).splitlines()
                     if line.startswith("run4 "))
    _sample_figure(plt, out, text, _SAMPLE_T_KP + [("p", "sample_p", "top-p 0.9 alone")],
                   "perf-sample-s28.png",
                   "one H200, tp=1, onesided, main bc1ae4c: "
                   "bench/results/2026-12-04-h200-s28-experiments.txt run 4 (dps-perf and "
                   "compare_torch.py, one session)")


def fig_verify(plt, out):
    """dpsVerifyChain at tp=1 against swap + torch verify + gather, and the read
    limit of the pad_bs*N rows."""
    path = os.path.join(RESULTS, "2026-12-01-h200-8e22594-verify.txt")
    text = _read(path)
    peak = hbm_peak_gbps(text)
    ours = dps_perf_tables(text)
    cmp_rows = compare_torch_tables(text, "verify")
    read = {r["pad_bs"]: r["bytes"] / (peak * 1e3) for r in ours if r["op"] == "verify_ref_argmax"}
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.1))
    for ax, (case, title) in zip(axes, [("greedy", "greedy"), ("kp", "top-k 50 + top-p 0.9")]):
        pts = sorted((int(r["shape"].split("x")[0]), r["onesided(us)"], r["torch(us)"])
                     for r in cmp_rows if r["case"] == case)
        x = [p[0] for p in pts]
        ax.plot(x, [p[1] for p in pts], "o-", label="dpsVerifyChain (onesided)")
        ax.plot(x, [p[2] for p in pts], "s-", color="C3", label="swap + torch verify + gather")
        ax.plot(x, [read[b] for b in x], "k--", label="read limit (%.0f GB/s)" % peak)
        _style(ax, "verify, " + title, "pad_bs (N = 4, bf16, V = 152064)")
    _save(fig, out, "perf-verify.png",
          "one H200, tp=1: bench/results/2026-12-01-h200-8e22594-verify.txt "
          "(dps-perf and compare_torch.py, one session)")


def fig_transport(plt, out):
    """swap, gather_verify_outputs, gather_verify_logprobs on 2 x H200:
    torch.distributed, the nccl and onesided backends (the torch comparison
    table), and the swap's peer-store limit (the default-run table)."""
    md = _read(PERF_MD)
    cmp_rows = md_table(md, "## Against torch.distributed", nth=0)
    default = md_table(md, "## Both backends, default run", nth=0)
    limit = {}
    for r in default:
        if r["op"] == "swap" and r["dtype"] == "bf16":
            limit[r["pad_bs×N×V"]] = num(r["onesided µs"]) * num(r["onesided link"]) / 100.0
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.1))
    for ax, op, title in zip(axes, ["swap", "gather", "logprobs"],
                             ["swap_batch_vocab (bf16)", "gather_verify_outputs",
                              "gather_verify_logprobs"]):
        pts = []
        for r in cmp_rows:
            if r["op"] != op or r["dtype"] not in ("bf16", "int32", "fp32"):
                continue
            if op == "swap" and r["dtype"] != "bf16":
                continue
            dims = [int(v) for v in r["shape"].split("×")]
            size = dims[0] * dims[1] * (dims[2] * 2 if op == "swap" else 1)
            pts.append((size, num(r["torch µs"]), num(r["dpsampling nccl µs"]),
                        num(r["dpsampling onesided µs"]), limit.get(r["shape"])))
        pts.sort()
        x = [p[0] for p in pts]
        ax.plot(x, [p[1] for p in pts], "s-", color="C3", label="torch.distributed")
        ax.plot(x, [p[2] for p in pts], "^-", color="C2", label="dpsampling nccl")
        ax.plot(x, [p[3] for p in pts], "o-", color="C0", label="dpsampling onesided")
        if op == "swap":
            lp = [(p[0], p[4]) for p in pts if p[4]]
            ax.plot([p[0] for p in lp], [p[1] for p in lp], "k--",
                    label="peer-store limit (365.6 GB/s)")
        _style(ax, title, "input bytes per rank" if op == "swap" else "pad_bs × N values")
    _save(fig, out, "perf-transport.png",
          "2 x H200 (NV18). docs/performance.md: torch comparison (65aaf6f) and the swap's limit "
          "from the default run (dc28dd1); no raw run committed")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "img"),
                    help="output folder (default docs/img)")
    args = ap.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.stderr.write(
            "plot_performance.py: matplotlib is not installed; it draws the figures.\n"
            "Install it with:  %s -m pip install matplotlib\n" % (sys.executable or "python3"))
        return 2
    os.makedirs(args.out, exist_ok=True)
    for f in (fig_transport, fig_select, fig_sample, fig_sample_s28, fig_verify):
        f(plt, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
