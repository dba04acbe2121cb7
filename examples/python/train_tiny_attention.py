#!/usr/bin/env python3
"""Trains a tiny causal self-attention layer on the CPU with flashattn.flash_attn_func in place
of FlashAttention-2's: the layer learns to imitate a fixed random "teacher" layer. Exits with
status 1 if the loss did not fall.

    pip install . torch && python examples/python/train_tiny_attention.py --steps 20
"""

import argparse

import torch

from flashattn import flash_attn_func  # instead of: from flash_attn import flash_attn_func


class CausalSelfAttention(torch.nn.Module):
    def __init__(self, dim, heads, dropout_p=0.1):
        super().__init__()
        self.heads = heads
        self.dropout_p = dropout_p
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        batch, seqlen, dim = x.shape
        # [batch, seqlen, 3, heads, head_dim] -> three [batch, seqlen, heads, head_dim] views, no copies
        q, k, v = self.qkv(x).view(batch, seqlen, 3, self.heads, dim // self.heads).unbind(2)
        out = flash_attn_func(q, k, v, dropout_p=self.dropout_p if self.training else 0.0, causal=True)
        return self.proj(out.reshape(batch, seqlen, dim))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seqlen", type=int, default=128)
    args = parser.parse_args()

    torch.manual_seed(0)  # also fixes the dropout masks flash_attn_func draws
    teacher = CausalSelfAttention(args.dim, args.heads).eval()
    student = CausalSelfAttention(args.dim, args.heads)
    optimizer = torch.optim.Adam(student.parameters(), lr=3e-3)
    losses = []
    for step in range(args.steps):
        x = torch.randn(8, args.seqlen, args.dim)
        with torch.no_grad():
            target = teacher(x)
        loss = torch.nn.functional.mse_loss(student(x), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        print("step %3d  loss %.5f" % (step, losses[-1]))
    if not losses[-1] < losses[0]:
        print("the loss did not fall")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
