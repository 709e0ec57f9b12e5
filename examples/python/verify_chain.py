"""The data-parallel speculative verify in one call, DpSamplingComm.verify_chain,
in place of the upstream block (swap, verify of this rank's requests on full
rows, gather):

    python examples/python/verify_chain.py                               # one GPU, tp = 1
    torchrun --nproc-per-node N examples/python/verify_chain.py [--backend ...]

Upstream, every rank swaps its vocabulary slice of the whole batch for the
full rows of its own requests, verifies their chains of drafts, and gathers
every rank's outputs:

    rows = comm.swap_batch_vocab(local_logits, pad_bs=pad_bs)    # [pad_bs/tp*N, V]
    predict, accept_index, accept_length, logprobs = verify(rows, candidates[mine])
    p, ai, al = comm.gather_verify_outputs(predict, accept_index, accept_length, pad_bs=pad_bs)
    lp = comm.gather_verify_logprobs(logprobs, pad_bs=pad_bs)

verify_chain does all of it on the vocabulary slices, moving only a few words
per row between the ranks, and returns the same full-batch outputs on every
rank:

    p, ai, al, lp = comm.verify_chain(local_logits, candidates, pad_bs=pad_bs,
                                      temperature=temps, seed=seeds, offset=offsets,
                                      return_logprobs=True)

Here every request is greedy (temperature 0), where both paths are
deterministic: the upstream verify is the argmax of each full row and the
chain walk, in torch below. The script runs both and checks that the outputs
have the same shapes, dtypes and values (logprobs within 1e-4: torch's
log_softmax and the library's sum in different orders); the exit status is 1
on a mismatch.
"""

import argparse
import os
import sys

import torch

from dpsampling import DpSamplingComm


def verify_greedy(rows, candidates, first_req, n):
    """The upstream chain verify of some requests on their full rows, greedy:
    rows [reqs*N, V] (request first_req + r at rows r*N .. r*N+N-1),
    candidates int32 [reqs, N] (column 0, the last accepted token, unused).
    Draft i is accepted while it equals the argmax of row i-1; the first
    rejected position (or the last one) gives the bonus token. Returns
    (predict, accept_index, accept_length, logprobs) with flat indices over
    the whole batch, -1 / 0 in the unused entries: the layout
    gather_verify_outputs gathers."""
    reqs = candidates.shape[0]
    dev = rows.device
    logp = rows.float().log_softmax(dim=-1)
    t = rows.argmax(dim=-1).view(reqs, n)  # lowest index on ties, as the library
    match = (candidates[:, 1:] == t[:, :-1].to(torch.int32)).to(torch.int64)
    acc = match.cumprod(dim=1).sum(dim=1)  # drafts accepted before the first rejection
    pos = torch.arange(n, device=dev)
    keep = pos.view(1, n) <= acc.view(reqs, 1)  # accepted drafts and the bonus token
    flat = (first_req + torch.arange(reqs, device=dev)).view(reqs, 1) * n + pos.view(1, n)
    predict = torch.where(keep, t, torch.zeros_like(t)).to(torch.int32)
    accept_index = torch.where(keep, flat, torch.full_like(flat, -1)).to(torch.int32)
    accept_length = (acc + 1).to(torch.int32)
    lp = logp.gather(1, t.view(-1, 1)).view(reqs, n)
    logprobs = torch.where(keep, lp, torch.zeros_like(lp))
    return predict, accept_index, accept_length, logprobs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="auto", choices=("auto", "nccl", "onesided"))
    ap.add_argument("--reqs-per-rank", type=int, default=5)
    ap.add_argument("--tokens-per-req", type=int, default=4, help="N (1 + drafts)")
    ap.add_argument("--vocab-per-rank", type=int, default=1000)
    args = ap.parse_args()

    if not torch.cuda.is_available():
        sys.exit("verify_chain.py: no usable CUDA device (torch.cuda.is_available() is False)")
    dist = None
    if "LOCAL_RANK" in os.environ:  # torchrun: one rank per GPU
        import torch.distributed as dist

        local_rank = int(os.environ["LOCAL_RANK"])
        if torch.cuda.device_count() <= local_rank:
            sys.exit(f"verify_chain.py: rank {local_rank} needs GPU {local_rank} but "
                     f"{torch.cuda.device_count()} GPU(s) are visible")
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
        rank, tp, group = dist.get_rank(), dist.get_world_size(), dist.group.WORLD
    else:  # one process, one GPU
        local_rank, rank, tp, group = 0, 0, 1, (0,)
        torch.cuda.set_device(0)
    device = torch.device("cuda", local_rank)

    reqs, n = args.reqs_per_rank, args.tokens_per_req
    pad_bs, vocab = reqs * tp, args.vocab_per_rank * tp
    v_local = vocab // tp
    comm = DpSamplingComm(
        tp_size=tp,
        rank=rank,
        group=group,  # the engine's ProcessGroup (or a tuple of global ranks)
        max_pad_bs=pad_bs,
        num_tokens_per_req=n,
        vocab_size=vocab,
        logits_dtype=torch.bfloat16,
        backend=args.backend,
    )

    # The whole batch's logits [pad_bs*N, V], the same on every rank (a CPU
    # generator); every rank holds the columns of its vocabulary slice.
    g = torch.Generator().manual_seed(2024)
    full = (torch.randn(pad_bs * n, vocab, generator=g) * 3.0).to(torch.bfloat16)
    local_logits = full[:, rank * v_local:(rank + 1) * v_local].contiguous().to(device)

    # Drafts: request b's first b % N drafts are the greedy tokens (accepted),
    # the next one is not, so accept_length runs over 1..N.
    best = full.float().argmax(dim=-1).view(pad_bs, n)
    candidates = torch.randint(0, vocab, (pad_bs, n), generator=g)
    for b in range(pad_bs):
        m = b % n
        candidates[b, 1:m + 1] = best[b, :m]
        if m + 1 < n:
            candidates[b, m + 1] = (best[b, m] + 1) % vocab
    candidates = candidates.to(torch.int32).to(device)

    # 1. upstream: swap, verify this rank's requests on full rows, gather
    rows = comm.swap_batch_vocab(local_logits, pad_bs=pad_bs)  # [reqs*N, V]
    mine = candidates[rank * reqs:(rank + 1) * reqs]
    predict, accept_index, accept_length, logprobs = verify_greedy(rows, mine, rank * reqs, n)
    p, ai, al = comm.gather_verify_outputs(predict, accept_index, accept_length, pad_bs=pad_bs)
    lp = comm.gather_verify_logprobs(logprobs, pad_bs=pad_bs)
    upstream = [t.clone() for t in (p, ai, al, lp)]  # the gathers' buffers are reused

    # 2. the same in one call on the vocabulary slices (per-request parameters
    #    may be tensors [pad_bs]; greedy here, so seed and offset do not matter)
    ours = comm.verify_chain(local_logits, candidates, pad_bs=pad_bs, temperature=0.0,
                             seed=0, offset=0, return_logprobs=True)

    ok = True
    for name, a, b in zip(("predict", "accept_index", "accept_length", "logprobs"), upstream,
                          ours):
        same_layout = a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
        if name == "logprobs":
            same = same_layout and torch.allclose(a, b, rtol=0.0, atol=1e-4)
        else:
            same = same_layout and torch.equal(a, b)
        if not same:
            ok = False
            print(f"rank {rank}: {name} differs: upstream {tuple(a.shape)} {a.dtype} "
                  f"{a.tolist()}, verify_chain {tuple(b.shape)} {b.dtype} {b.tolist()}",
                  flush=True)
    lengths = sorted(set(upstream[2].tolist()))
    print(f"rank {rank}/{tp} (cuda:{local_rank}, backend {comm.backend}): pad_bs {pad_bs}, "
          f"N {n}, accept lengths {lengths}: {'the same outputs' if ok else 'MISMATCH'}",
          flush=True)
    comm.close()
    failed = 0 if ok else 1
    if dist is not None:
        verdict = torch.tensor([failed], device=device)
        dist.all_reduce(verdict)
        failed = int(verdict.item())
        dist.destroy_process_group()
    if failed:
        if rank == 0:
            print(f"verify_chain.py: FAILED on {failed} rank(s)", flush=True)
        sys.exit(1)
    if rank == 0:
        print(f"verify_chain.py: {tp} rank(s) passed", flush=True)


if __name__ == "__main__":
    main()
