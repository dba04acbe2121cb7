"""Double-precision NumPy attention (the semantics of README "Semantics"), forward and backward,
with the dropout mask taken from flashattn.dropout_mask (its stream is checked against Random123
by the C tests)."""

import numpy as np

import flashattn


def visible(seqlen_q, seqlen_k, causal=False, window=(-1, -1), valid_k=None, block_mask=None,
            block_size=(128, 128)):
    i = np.arange(seqlen_q)[:, None]
    j = np.arange(seqlen_k)[None, :]
    shift = seqlen_k - seqlen_q  # bottom-right alignment
    vis = np.ones((seqlen_q, seqlen_k), dtype=bool)
    if valid_k is not None:
        vis &= j < valid_k
    if causal:
        vis &= j <= i + shift
    if window[0] >= 0:
        vis &= j >= i + shift - window[0]
    if window[1] >= 0:
        vis &= j <= i + shift + window[1]
    if block_mask is not None:
        vis &= np.asarray(block_mask)[i // block_size[0], j // block_size[1]] != 0
    return vis


def attention(q, k, v, dout=None, *, causal=False, softmax_scale=None, window=(-1, -1), seqlens_k=None,
              dropout_p=0.0, seed=0, offset=0, block_mask=None, block_size=(128, 128)):
    """Returns (out, lse) or, with dout, (out, lse, dq, dk, dv), all float64."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    scale = head_dim ** -0.5 if softmax_scale is None else softmax_scale
    out = np.zeros_like(q)
    lse = np.full((batch, heads_q, seqlen_q), -np.inf)
    grads = (np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)) if dout is not None else None
    for b in range(batch):
        vis = visible(seqlen_q, seqlen_k, causal, window, None if seqlens_k is None else seqlens_k[b], block_mask,
                      block_size)
        for h in range(heads_q):
            kv = h // group
            s = np.where(vis, scale * q[b, :, h] @ k[b, :, kv].T, -np.inf)
            m = s.max(axis=1, keepdims=True)
            m_safe = np.where(np.isfinite(m), m, 0.0)
            e = np.where(vis, np.exp(s - m_safe), 0.0)
            l = e.sum(axis=1, keepdims=True)
            p = np.divide(e, l, out=np.zeros_like(e), where=l > 0)
            lse[b, h] = np.where(l[:, 0] > 0, m_safe[:, 0] + np.log(np.where(l[:, 0] > 0, l[:, 0], 1.0)), -np.inf)
            keep = 1.0
            if dropout_p > 0:
                keep = flashattn.dropout_mask(seed, offset, dropout_p, heads_q, seqlen_q, seqlen_k, b, h) / (1 - dropout_p)
            pd = p * keep
            out[b, :, h] = pd @ v[b, :, kv]
            if dout is not None:
                do = np.asarray(dout[b, :, h], dtype=np.float64)
                grads[2][b, :, kv] += pd.T @ do
                dp = (do @ v[b, :, kv].T) * keep
                ds = p * (dp - (dp * p).sum(axis=1, keepdims=True))
                grads[0][b, :, h] = scale * ds @ k[b, :, kv]
                grads[1][b, :, kv] += scale * ds.T @ q[b, :, h]
    return (out, lse) if dout is None else (out, lse) + grads
