#!/usr/bin/env python3
"""Padding-free training with flashattn.flash_attn_varlen_func on the CPU.

A tiny causal transformer (token and position embeddings, two pre-norm attention blocks, an LM
head) learns a synthetic task: at every position, name the first token of the sequence. Each
step's batch holds sequences of different lengths (1 up to 48 tokens) packed one after another
into a single [total_tokens, ...] tensor, with cu_seqlens marking where each sequence starts, so
no compute is spent on padding. The task needs attention to position 0 of the token's own
sequence, so any leak across sequence boundaries would hurt it.

At step 0 the example checks that packing is exact: the gradient of every parameter equals the
one from the same model run on the right-padded [batch, max_len, ...] batch with
flash_attn_func(causal=True), padding excluded from the loss. Then it trains and checks that the
loss falls. Exits with a non-zero status if either check fails.

    pip install . torch && python examples/python/train_packed.py --steps 40 --seed 0
"""

import argparse

import torch
import torch.nn.functional as F

from flashattn import flash_attn_func, flash_attn_varlen_func

VOCAB = 16
# Three sequences of length 1 (the smallest there is), many short ones and a few longer ones.
# Each sequence has one answer (its first token), so it takes about 20 of them per batch for a
# smooth loss curve.
LENGTHS = [1, 5, 1, 12, 2, 31, 7, 48, 3, 20, 9, 1, 16, 4, 26, 2, 40, 6, 11, 3]
# float32 gradients of the packed and padded runs differ only by summation order (the weight
# gradients sum over the rows in another order, the padded run's padding rows adding zeros):
# relative to each gradient's largest entry that stays below 1e-6, so 1e-5 leaves a wide margin
# and still catches an error as small as one token attending across a sequence boundary.
GRAD_RTOL = 1e-5


class Block(torch.nn.Module):
    """Pre-norm causal self-attention plus an MLP. The attention itself is passed in by the
    caller (attend(q, k, v) -> out), so one set of weights runs on both layouts: x is
    [total_tokens, dim] when packed and [batch, max_len, dim] when padded."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x, attend):
        head_dim = x.shape[-1] // self.heads
        # [..., 3 * dim] -> three [..., heads, head_dim] views: the layout both attention calls take.
        q, k, v = self.qkv(self.norm1(x)).unflatten(-1, (3, self.heads, head_dim)).unbind(-3)
        x = x + self.proj(attend(q, k, v).flatten(-2))
        return x + self.mlp(self.norm2(x))


class TinyLM(torch.nn.Module):
    def __init__(self, dim=64, heads=4, layers=2, max_len=64):
        super().__init__()
        self.tokens = torch.nn.Embedding(VOCAB, dim)
        self.positions = torch.nn.Embedding(max_len, dim)
        self.blocks = torch.nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, VOCAB)

    def forward(self, tokens, positions, attend):
        x = self.tokens(tokens) + self.positions(positions)
        for block in self.blocks:
            x = block(x, attend)
        return self.head(self.norm(x))


def make_batch(lengths, generator):
    """Random sequences and their targets (each position's target is the sequence's first token)."""
    sequences = [torch.randint(0, VOCAB, (n,), generator=generator) for n in lengths]
    targets = [torch.full((n,), int(seq[0])) for n, seq in zip(lengths, sequences)]
    return sequences, targets


def packed_loss(model, sequences, targets):
    lengths = torch.tensor([len(s) for s in sequences])
    # cu_seqlens[b] is where sequence b starts in the packed batch; the last entry is the total.
    cu_seqlens = torch.zeros(len(sequences) + 1, dtype=torch.int32)
    cu_seqlens[1:] = torch.cumsum(lengths, 0)
    max_len = int(lengths.max())
    # Positions restart at 0 in every sequence, as they would in a padded batch.
    positions = torch.cat([torch.arange(n) for n in lengths.tolist()])

    def attend(q, k, v):
        return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, causal=True)

    logits = model(torch.cat(sequences), positions, attend)
    return F.cross_entropy(logits, torch.cat(targets))


def padded_loss(model, sequences, targets):
    batch, max_len = len(sequences), max(len(s) for s in sequences)
    tokens = torch.zeros(batch, max_len, dtype=torch.long)
    labels = torch.full((batch, max_len), -100)  # -100: cross_entropy's ignore_index, i.e. padding
    for b, (seq, target) in enumerate(zip(sequences, targets)):
        tokens[b, :len(seq)] = seq
        labels[b, :len(seq)] = target
    positions = torch.arange(max_len).expand(batch, max_len)

    # Padding sits on the right, so with a causal mask no real token ever sees a padding token:
    # the real tokens' outputs equal the packed run's.
    def attend(q, k, v):
        return flash_attn_func(q, k, v, causal=True)

    logits = model(tokens, positions, attend)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


def gradients(model, loss_fn, sequences, targets):
    model.zero_grad()
    loss = loss_fn(model, sequences, targets)
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters()}


def check_packed_matches_padded(model, sequences, targets):
    """Prints the largest gradient difference over all parameters, each relative to that
    gradient's largest entry, and raises AssertionError if it exceeds GRAD_RTOL."""
    packed_value, packed = gradients(model, packed_loss, sequences, targets)
    padded_value, padded = gradients(model, padded_loss, sequences, targets)
    print("step 0 loss: packed %.7f, padded %.7f" % (packed_value, padded_value))
    worst_name, worst = None, 0.0
    for name, grad in packed.items():
        scale = padded[name].abs().max().item()
        assert scale > 0, "%s: zero gradient in the padded run, nothing to compare" % name
        diff = (grad - padded[name]).abs().max().item() / scale
        if diff >= worst:
            worst_name, worst = name, diff
    print("max relative gradient difference packed vs padded: %.2e (%s; tolerance %.0e, %d parameters)" %
          (worst, worst_name, GRAD_RTOL, len(packed)))
    assert worst <= GRAD_RTOL, "packed and padded gradients differ: %s by %.2e" % (worst_name, worst)
    assert abs(packed_value - padded_value) <= GRAD_RTOL * abs(padded_value), "the losses differ"
    model.zero_grad()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps (default 40)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.steps < 20:
        parser.error("--steps: the check wants the loss halved, which takes about 20 steps")

    torch.manual_seed(args.seed)
    data = torch.Generator().manual_seed(args.seed)
    model = TinyLM(max_len=max(LENGTHS))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    print("sequence lengths %s packed into %d tokens (padded: %d x %d = %d)" %
          (LENGTHS, sum(LENGTHS), len(LENGTHS), max(LENGTHS), len(LENGTHS) * max(LENGTHS)))

    losses = []
    for step in range(args.steps):
        # Fresh tokens each step, and the lengths in a new order, so sequences move around the pack.
        order = torch.randperm(len(LENGTHS), generator=data).tolist()
        sequences, targets = make_batch([LENGTHS[i] for i in order], data)
        if step == 0:
            check_packed_matches_padded(model, sequences, targets)
        loss = packed_loss(model, sequences, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        print("step %3d  loss %.4f" % (step, losses[-1]))

    # A clear margin, not just noise: the first loss is about ln(VOCAB) = 2.77 (chance).
    print("loss %.4f -> %.4f" % (losses[0], losses[-1]))
    assert losses[-1] < 0.5 * losses[0], "the loss did not fall by half: %.4f -> %.4f" % (losses[0], losses[-1])


if __name__ == "__main__":
    main()
