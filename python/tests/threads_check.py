"""One process, one thread per rank (2 GPUs), run by test_threads.py: checks that no library call that
may block holds the GIL (lazy first swap = collective prepare, destroy), and
the busy guard (re-entrant and cross-thread use while a call is in progress)."""
import os, sys, threading, time, gc
import torch
import dpsampling
from dpsampling import _dpsampling as C

TP, V, N, MAXB = 2, 256, 2, 8
backend_name = sys.argv[1] if len(sys.argv) > 1 else "auto"
backend = {"auto": C.BACKEND_AUTO, "nccl": C.BACKEND_NCCL, "onesided": C.BACKEND_ONESIDED}[backend_name]
probe_busy = "--no-busy" not in sys.argv

uid = C.get_unique_id()
bar = threading.Barrier(TP)
shared = {}
notes = []          # (rank, what, ok, detail)
errors = []
comms = {}
ev_in, ev_done = threading.Event(), threading.Event()

def note(r, what, ok, detail=""):
    notes.append((r, what, ok, detail))

def progress(r, what, detail=""):
    """A step reached (printed, not a check)."""
    print("PROGRESS", (r, what, detail), flush=True)

def backend_ok(name):
    """The resolved backend is the one asked for (auto: either)."""
    return backend_name == "auto" or name == backend_name

def expect_busy(r, what, fn, match):
    try:
        fn()
    except RuntimeError as e:
        note(r, what, match in str(e), str(e)[:160])
        return
    note(r, what, False, "no RuntimeError")

class ThreadGather:
    """all_gather_into_tensor across the rank threads of this process, in Python."""
    def __init__(self, r):
        self.r = r
    def all_gather_into_tensor(self, out, inp, group=None):
        r = self.r
        comm = comms[r]
        if probe_busy and r == 0:
            expect_busy(r, "reenter close", comm.close, "in use by gather_verify_outputs")
            expect_busy(r, "reenter swap", lambda: comm.swap_batch_vocab(torch.zeros(MAXB * N, V // TP, device="cuda:0")), "in use by gather_verify_outputs")
            expect_busy(r, "reenter set_collectives", lambda: comm._set_collectives(None, (0, 1)), "in use")
            note(r, "async_error during the call (watchdog-safe)", comm.async_error() is None, "")
            note(r, "getter snapshot", comm.max_pad_bs == MAXB and comm.is_initialized is (comm.backend == "onesided") and not comm.closed, "")
            ev_in.set()
            note(r, "intruder finished", ev_done.wait(60), "")
        torch.cuda.current_stream(r).synchronize()
        shared[r] = inp
        bar.wait()
        n = inp.numel()
        for p in range(TP):
            out[p * n:(p + 1) * n].copy_(shared[p])
        torch.cuda.current_stream(r).synchronize()
        bar.wait()

def intruder():
    if not ev_in.wait(120):
        note(-1, "intruder saw the callback", False); return
    c0 = comms[0]
    expect_busy(-1, "other-thread close", c0.close, "on another thread")
    expect_busy(-1, "other-thread logprobs", lambda: c0.gather_verify_logprobs(torch.zeros(MAXB // TP, N, device="cuda:0")), "in use by gather_verify_outputs")
    note(-1, "other-thread getter", backend_ok(c0.backend), c0.backend)
    ev_done.set()

def rank_main(r):
    try:
        torch.cuda.set_device(r)
        dev = f"cuda:{r}"
        g = C.NcclGroup(uid, TP, r, r)
        comm = dpsampling.DpSamplingComm.__new__(dpsampling.DpSamplingComm)
        comm._create(g, TP, r, MAXB, N, V, C.DTYPE_UNSET, backend, r)  # dtype unset: first swap prepares
        comms[r] = comm
        note(r, "backend", backend_ok(comm.backend), comm.backend)
        L = torch.arange(MAXB * N * V, dtype=torch.float32, device=dev).reshape(MAXB * N, V)
        x = L[:, r * (V // TP):(r + 1) * (V // TP)].contiguous()
        torch.cuda.synchronize()
        bar.wait()
        t0 = time.time()
        out = comm.swap_batch_vocab(x)           # lazy prepare: collective
        progress(r, "first swap s", f"{time.time() - t0:.3f}")
        rows = MAXB // TP * N
        torch.cuda.synchronize()
        note(r, "swap result", torch.equal(out, L[r * rows:(r + 1) * rows]), "")
        reqs = MAXB // TP
        p = (torch.arange(reqs * N, dtype=torch.int32, device=dev).reshape(reqs, N) + 1000 * r)
        ai = p + 1; al = torch.arange(reqs, dtype=torch.int32, device=dev) + 100 * r
        po, aio, alo = comm.gather_verify_outputs(p, ai, al)
        torch.cuda.synchronize()
        P = torch.cat([torch.arange(reqs * N, dtype=torch.int32, device=dev).reshape(reqs, N) + 1000 * q for q in range(TP)])
        AL = torch.cat([torch.arange(reqs, dtype=torch.int32, device=dev) + 100 * q for q in range(TP)])
        note(r, "gather result", torch.equal(po, P) and torch.equal(aio, P + 1) and torch.equal(alo, AL), "")
        lp = torch.full((reqs, N), float(r), device=dev)
        lo = comm.gather_verify_logprobs(lp)
        torch.cuda.synchronize()
        note(r, "logprobs result", torch.equal(lo[:reqs], torch.zeros(reqs, N, device=dev)) and torch.equal(lo[reqs:], torch.ones(reqs, N, device=dev)), "")
        if comm.backend == "nccl":
            comm._set_collectives(ThreadGather(r), (0, 1))
            p2 = p + 7
            po, aio, alo = comm.gather_verify_outputs(p2, ai, al)
            torch.cuda.synchronize()
            note(r, "python-fallback gather", torch.equal(po, P + 7), "")
            comm._set_collectives(None, (0, 1))
        keep = out
        del out, po, aio, alo, lo
        bar.wait()
        comm.close()                              # the tensor keeps the handle
        note(r, "closed", comm.closed, "")
        bar.wait()
        del keep                                  # DLPack deleter destroys (collective for onesided)
        gc.collect()
        progress(r, "destroyed via deleter")
        bar.wait()
        del g                                     # ncclCommDestroy
        progress(r, "group released")
    except BaseException as e:
        import traceback
        errors.append(f"rank {r}: {traceback.format_exc()}")
        bar.abort()

threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(TP)]
it = threading.Thread(target=intruder, daemon=True)
for t in threads: t.start()
if probe_busy: it.start()
for t in threads: t.join(180)
alive = [t for t in threads if t.is_alive()]
for n in notes: print("NOTE", n)
for e in errors: print("ERROR", e)
bad = [n for n in notes if not n[2]]
print("RESULT", backend_name, "alive" if alive else "joined", "errors=%d" % len(errors), "bad=%d" % len(bad), flush=True)
os._exit(1 if (alive or errors or bad) else 0)
