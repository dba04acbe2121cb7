#!/usr/bin/env python3
"""Greedy generation over a paged KV cache with flashattn.flash_attn_with_kvcache on the CPU.

A tiny decoder with random weights (three layers, grouped-query attention: 4 query heads share
2 key/value heads) generates text for three prompts of different lengths. Every layer keeps its
keys and values in a pool of fixed-size pages; a block table maps each sequence's logical pages
to pages of the pool. The page size is not a power of two and the pages are handed out in a
shuffled order, so a sequence's tokens are scattered through the pool.

Each prompt is prefilled on its own (the lengths differ), appending its keys and values to the
cache; then every step feeds the last generated token of all sequences in one batched call,
which appends each sequence's new key and value at its own length. A reference loop
recomputes full causal attention over each whole sequence at every step (PyTorch's
scaled_dot_product_attention, key/value heads repeated for the query heads). The example
checks that both produce the same tokens (and nearly the same logits) and exits with a non-zero
status if not.

    pip install . torch && python examples/python/generate_paged.py --steps 12 --page-size 5
"""

import argparse

import torch
import torch.nn.functional as F

from flashattn import flash_attn_with_kvcache

VOCAB = 64
DIM, HEADS, KV_HEADS, LAYERS = 64, 4, 2, 3
HEAD_DIM = DIM // HEADS
PROMPT_LENGTHS = [3, 11, 7]
# Logits of the cached and the recomputed run differ by float32 rounding only (below 1e-6).
LOGIT_ATOL = 1e-5


class Layer(torch.nn.Module):
    """Pre-norm attention with grouped-query heads, then an MLP. attend(q, k, v) is given by the
    caller, so the same weights run against the paged cache and in the reference."""

    def __init__(self):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(DIM)
        self.wq = torch.nn.Linear(DIM, HEADS * HEAD_DIM)
        self.wkv = torch.nn.Linear(DIM, 2 * KV_HEADS * HEAD_DIM)
        self.wo = torch.nn.Linear(HEADS * HEAD_DIM, DIM)
        self.norm2 = torch.nn.LayerNorm(DIM)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(), torch.nn.Linear(4 * DIM, DIM))

    def forward(self, x, attend):
        h = self.norm1(x)
        q = self.wq(h).unflatten(-1, (HEADS, HEAD_DIM))  # [batch, seqlen, heads, head_dim]
        k, v = self.wkv(h).unflatten(-1, (2, KV_HEADS, HEAD_DIM)).unbind(-3)
        x = x + self.wo(attend(q, k, v).flatten(-2))
        return x + self.mlp(self.norm2(x))


class TinyDecoder(torch.nn.Module):
    def __init__(self, max_positions):
        super().__init__()
        self.tokens = torch.nn.Embedding(VOCAB, DIM)
        self.positions = torch.nn.Embedding(max_positions, DIM)
        self.layers = torch.nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = torch.nn.LayerNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens, positions, attend):
        """tokens, positions: [batch, seqlen]; attend(layer_index, q, k, v). Returns the logits
        [batch, seqlen, VOCAB]."""
        x = self.tokens(tokens) + self.positions(positions)
        for index, layer in enumerate(self.layers):
            x = layer(x, lambda q, k, v: attend(index, q, k, v))
        return self.head(self.norm(x))


class PagedKVCache:
    """One pool of pages per layer for keys and one for values, [num_pages, page_size, KV_HEADS,
    HEAD_DIM], shared by all sequences; block_table[b, i] is the pool page holding sequence b's
    tokens i * page_size .. (i + 1) * page_size - 1; seqlens[b] counts the tokens cached."""

    def __init__(self, batch, capacity, page_size, generator, spare_pages=3):
        pages_per_sequence = -(-capacity // page_size)
        num_pages = batch * pages_per_sequence + spare_pages
        # A shuffled pool: neighbouring logical pages land far apart, and a few pool pages are
        # never used, as in a server whose pool is shared with other requests.
        order = torch.randperm(num_pages, generator=generator)[:batch * pages_per_sequence]
        self.block_table = order.view(batch, pages_per_sequence).to(torch.int32)
        # Slots not yet written hold NaN: a read of one would turn the outputs to NaN.
        shape = (num_pages, page_size, KV_HEADS, HEAD_DIM)
        self.k = [torch.full(shape, float("nan")) for _ in range(LAYERS)]
        self.v = [torch.full(shape, float("nan")) for _ in range(LAYERS)]
        self.seqlens = torch.zeros(batch, dtype=torch.int32)


def generate_paged(model, prompts, steps, page_size, generator):
    """Greedy generation with the paged cache: (generated tokens [batch, steps], the logits
    each token was picked from [batch, steps, VOCAB], the cache)."""
    batch = len(prompts)
    cache = PagedKVCache(batch, max(len(p) for p in prompts) + steps, page_size, generator)
    logits = torch.empty(batch, steps, VOCAB)

    # Prefill, one call per sequence and layer: the prompts differ in length, and a batched call
    # would append the padding of the shorter ones to their caches. Each call sees the whole
    # pool but only its own row of the block table, and is causal within the prompt.
    for b, prompt in enumerate(prompts):
        def attend_prefill(layer, q, k, v):
            return flash_attn_with_kvcache(q, cache.k[layer], cache.v[layer], k, v,
                                           cache_seqlens=cache.seqlens[b:b + 1],
                                           block_table=cache.block_table[b:b + 1], causal=True)

        positions = torch.arange(len(prompt))[None]
        logits[b, 0] = model(prompt[None], positions, attend_prefill)[0, -1]
        # The call appends but does not advance the cached lengths: that is the caller's job,
        # after all layers have appended at the same place.
        cache.seqlens[b] += len(prompt)

    # Decode: every sequence feeds one token per step; cache_seqlens (a tensor, one length per
    # sequence) says where each appends, so the different lengths need no padding.
    def attend_decode(layer, q, k, v):
        return flash_attn_with_kvcache(q, cache.k[layer], cache.v[layer], k, v, cache_seqlens=cache.seqlens,
                                       block_table=cache.block_table, causal=True)

    for step in range(1, steps):
        last = logits[:, step - 1].argmax(-1)
        positions = cache.seqlens.long()[:, None]  # the new token's position in each sequence
        logits[:, step] = model(last[:, None], positions, attend_decode)[:, 0]
        cache.seqlens += 1
    return logits.argmax(-1), logits, cache


def full_attention(q, k, v):
    """Causal attention over the whole sequence, without flashattn: [batch, seqlen, heads, d]."""
    group = HEADS // KV_HEADS  # query head h reads key/value head h // group
    q, k, v = (t.transpose(1, 2) for t in (q, k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)


def generate_reference(model, prompts, steps):
    """Greedy generation recomputing everything each step: (tokens, logits) as generate_paged."""
    tokens = torch.empty(len(prompts), steps, dtype=torch.long)
    logits = torch.empty(len(prompts), steps, VOCAB)
    for b, prompt in enumerate(prompts):
        sequence = prompt
        for step in range(steps):
            positions = torch.arange(len(sequence))[None]
            logits[b, step] = model(sequence[None], positions, lambda layer, q, k, v: full_attention(q, k, v))[0, -1]
            tokens[b, step] = logits[b, step].argmax()
            sequence = torch.cat([sequence, tokens[b, step:step + 1]])
    return tokens, logits


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12,
                        help="tokens to generate per prompt: the prefill gives the first, each decode step one more")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--page-size", type=int, default=5, help="tokens per cache page (default 5)")
    args = parser.parse_args()
    if args.steps < 1 or args.page_size < 1:
        parser.error("--steps and --page-size must be at least 1")

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    model = TinyDecoder(max(PROMPT_LENGTHS) + args.steps).eval()
    prompts = [torch.randint(0, VOCAB, (n,), generator=generator) for n in PROMPT_LENGTHS]

    with torch.no_grad():
        tokens, logits, cache = generate_paged(model, prompts, args.steps, args.page_size, generator)
        ref_tokens, ref_logits = generate_reference(model, prompts, args.steps)

    print("page size %d, block table (pool pages of each sequence, shuffled):" % args.page_size)
    for b, row in enumerate(cache.block_table.tolist()):
        print("  sequence %d: %s" % (b, row))
    for b, prompt in enumerate(prompts):
        print("prompt %d (%2d tokens) %s" % (b, len(prompt), prompt.tolist()))
        print("  paged cache: %s" % tokens[b].tolist())
        print("  reference:   %s" % ref_tokens[b].tolist())
    # How close the logits are, and how far apart the best two logits were at the closest
    # pick: a gap far above the difference means the greedy choices cannot flip by rounding.
    logit_diff = (logits - ref_logits).abs().max().item()
    top2 = ref_logits.topk(2, dim=-1).values
    print("max logit difference %.2e (tolerance %.0e); smallest top-2 logit gap %.2e" %
          (logit_diff, LOGIT_ATOL, (top2[..., 0] - top2[..., 1]).min().item()))

    expected_lengths = [len(p) + args.steps - 1 for p in prompts]  # the last token is not fed back
    assert cache.seqlens.tolist() == expected_lengths, "cached lengths %s, expected %s" % (
        cache.seqlens.tolist(), expected_lengths)
    assert torch.equal(tokens, ref_tokens), "the paged cache generated other tokens than the reference"
    assert logit_diff <= LOGIT_ATOL, "the logits differ by %.2e" % logit_diff
    print("paged generation matches the reference")


if __name__ == "__main__":
    main()
