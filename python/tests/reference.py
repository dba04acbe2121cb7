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


def alibi_distance(seqlen_q, seqlen_k):
    """|i + seqlen_k - seqlen_q - j|: the ALiBi distance, bottom-right aligned like causal."""
    i = np.arange(seqlen_q)[:, None]
    j = np.arange(seqlen_k)[None, :]
    return np.abs(i + seqlen_k - seqlen_q - j).astype(np.float64)


def attention(q, k, v, dout=None, *, causal=False, softmax_scale=None, window=(-1, -1), seqlens_k=None,
              dropout_p=0.0, seed=0, offset=0, block_mask=None, block_size=(128, 128), softcap=0.0,
              alibi_slopes=None, sinks=None, bias=None, return_modifier_grads=False, dropout_keep=None):
    """Returns (out, lse) or, with dout, (out, lse, dq, dk, dv), all float64; with
    return_modifier_grads also dsinks [heads_q] and dbias [batch, heads_q, seqlen_q, seqlen_k]
    (per element, not summed over the bias's broadcast). dropout_keep(b, h): the keep mask
    [seqlen_q, seqlen_k] of (b, h) when the stream's elements are not this layout's own (varlen)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    scale = head_dim ** -0.5 if softmax_scale is None else softmax_scale
    if alibi_slopes is not None:
        alibi_slopes = np.broadcast_to(np.asarray(alibi_slopes, dtype=np.float64), (batch, heads_q))
    if bias is not None:
        bias = np.broadcast_to(np.asarray(bias, dtype=np.float64), (batch, heads_q, seqlen_q, seqlen_k))
    out = np.zeros_like(q)
    lse = np.full((batch, heads_q, seqlen_q), -np.inf)
    grads = (np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)) if dout is not None else None
    dsinks = np.zeros(heads_q)
    dbias = np.zeros((batch, heads_q, seqlen_q, seqlen_k))
    for b in range(batch):
        vis = visible(seqlen_q, seqlen_k, causal, window, None if seqlens_k is None else seqlens_k[b], block_mask,
                      block_size)
        for h in range(heads_q):
            kv = h // group
            s = scale * q[b, :, h] @ k[b, :, kv].T
            softcap_slope = 1.0  # d s / d (scale * q.k)
            if softcap > 0:
                t = np.tanh(s / softcap)
                s = softcap * t
                softcap_slope = 1.0 - t * t
            if alibi_slopes is not None:
                s = s - alibi_slopes[b, h] * alibi_distance(seqlen_q, seqlen_k)
            if bias is not None:
                s = s + bias[b, h]
            s = np.where(vis, s, -np.inf)
            m = s.max(axis=1, keepdims=True)
            if sinks is not None:
                m = np.maximum(m, sinks[h])
            m_safe = np.where(np.isfinite(m), m, 0.0)
            e = np.where(vis, np.exp(s - m_safe), 0.0)
            l = e.sum(axis=1, keepdims=True)
            if sinks is not None:
                l = l + np.exp(sinks[h] - m_safe)
            p = np.divide(e, l, out=np.zeros_like(e), where=l > 0)
            lse[b, h] = np.where(l[:, 0] > 0, m_safe[:, 0] + np.log(np.where(l[:, 0] > 0, l[:, 0], 1.0)), -np.inf)
            keep = 1.0
            if dropout_p > 0:
                mask = (dropout_keep(b, h) if dropout_keep is not None
                        else flashattn.dropout_mask(seed, offset, dropout_p, heads_q, seqlen_q, seqlen_k, b, h))
                keep = mask / (1 - dropout_p)
            pd = p * keep
            out[b, :, h] = pd @ v[b, :, kv]
            if dout is not None:
                do = np.asarray(dout[b, :, h], dtype=np.float64)
                grads[2][b, :, kv] += pd.T @ do
                dp = (do @ v[b, :, kv].T) * keep
                row_dot = (dp * p).sum(axis=1, keepdims=True)
                ds = p * (dp - row_dot)
                dbias[b, h] = ds
                if sinks is not None:
                    # The sink's probability exp(sink - lse) times (0 - row_dot): it carries no value.
                    dsinks[h] -= (np.exp(sinks[h] - lse[b, h]) * row_dot[:, 0]).sum()
                ds = ds * softcap_slope
                grads[0][b, :, h] = scale * ds @ k[b, :, kv]
                grads[1][b, :, kv] += scale * ds.T @ q[b, :, h]
    if dout is None:
        return out, lse
    return (out, lse) + grads + ((dsinks, dbias) if return_modifier_grads else ())


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dout=None, *, dropout_p=0.0,
                     seed=0, offset=0, alibi_slopes=None, bias=None, **options):
    """attention() of a packed batch, sequence by sequence: q [total_q, heads_q, d], k, v
    [total_k, heads_kv, d]. Returns (out, lse [heads_q, total_q]) or with dout also (dq, dk, dv),
    packed. Dropout draws the padded [batch, heads_q, max_seqlen_q, max_seqlen_k] layout's
    elements; alibi_slopes [batch, heads_q] and bias [batch, heads_q, max_seqlen_q,
    max_seqlen_k] are indexed by sequence from its first row and key."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    heads_q = q.shape[1]
    out = np.zeros_like(q)
    lse = np.full((heads_q, q.shape[0]), -np.inf)
    grads = (np.zeros_like(q), np.zeros_like(k), np.zeros_like(v))
    for b in range(len(cu_seqlens_q) - 1):
        rows = slice(int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]))
        keys = slice(int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1]))
        len_q, len_k = rows.stop - rows.start, keys.stop - keys.start
        if len_q == 0:
            continue
        if len_k == 0:  # no keys: zero rows, lse -inf (or the sink's logit)
            sinks = options.get("sinks")
            lse[:, rows] = -np.inf if sinks is None else np.asarray(sinks, dtype=np.float64)[:, None]
            continue
        seq = dict(options)
        if alibi_slopes is not None:
            slopes = np.asarray(alibi_slopes, dtype=np.float64)
            seq["alibi_slopes"] = slopes[b] if slopes.ndim == 2 else slopes
        if bias is not None:
            seq["bias"] = np.broadcast_to(bias, (len(cu_seqlens_q) - 1, heads_q, max_seqlen_q, max_seqlen_k))[
                b:b + 1, :, :len_q, :len_k]
        if dropout_p > 0:
            seq["dropout_keep"] = lambda _, h, b=b: flashattn.dropout_mask(
                seed, offset, dropout_p, heads_q, max_seqlen_q, max_seqlen_k, b, h)[:len_q, :len_k]
        args = [x[None] for x in (q[rows], k[keys], v[keys])]
        if dout is not None:
            args.append(np.asarray(dout, dtype=np.float64)[None, rows])
        result = attention(*args, dropout_p=dropout_p, seed=seed, offset=offset, **seq)
        out[rows] = result[0][0]
        lse[:, rows] = result[1][0]
        if dout is not None:
            grads[0][rows] = result[2][0]
            grads[1][keys] = result[3][0]
            grads[2][keys] = result[4][0]
    return (out, lse) + (grads if dout is not None else ())


def kvcache_attention(q, k_cache, v_cache, cache_seqlens, k=None, v=None, *, block_table=None, cu_seqlens_q=None,
                      cu_seqlens_k_new=None, cache_batch_idx=None, cache_leftpad=None, alibi_slopes=None,
                      **options):
    """fa_forward_kvcache's semantics on copies of the caches: returns (out, lse, k_cache, v_cache),
    the caches after the append. q [batch, seqlen_q, heads_q, d] with k, v [batch, seqlen_new,
    heads_kv, d] (lse [batch, heads_q, seqlen_q]), or with cu_seqlens_q ragged: q [total_q, heads_q,
    d], k, v [total_new, heads_kv, d] packed by cu_seqlens_k_new (None: by cu_seqlens_q), lse
    [heads_q, total_q]. Sequence b appends at cache_seqlens[b] of row cache_batch_idx[b] (default b)
    or through block_table, and attends to that row's positions cache_leftpad[b] (default 0) ..
    cache_seqlens[b] + new - 1, its queries aligned at the end of those keys."""
    k_cache, v_cache = np.array(k_cache), np.array(v_cache)
    ragged = cu_seqlens_q is not None
    batch = len(cu_seqlens_q) - 1 if ragged else q.shape[0]
    seqlens = np.broadcast_to(np.asarray(cache_seqlens), (batch,))
    leftpad = np.zeros(batch, np.int64) if cache_leftpad is None else np.broadcast_to(np.asarray(cache_leftpad),
                                                                                      (batch,))
    cu_new = cu_seqlens_k_new if cu_seqlens_k_new is not None else cu_seqlens_q
    heads_q = q.shape[-2]
    out = np.zeros(q.shape)
    lse = np.full((heads_q, q.shape[0]) if ragged else (batch, heads_q, q.shape[1]), -np.inf)
    slopes = None if alibi_slopes is None else np.broadcast_to(np.asarray(alibi_slopes, dtype=np.float64),
                                                               (batch, heads_q))

    def positions(b, first, count):
        """(cache row or page, row within it) of sequence b's positions first .. first + count - 1."""
        pos = np.arange(first, first + count)
        if block_table is not None:
            page_size = k_cache.shape[1]
            return np.asarray(block_table)[b][pos // page_size], pos % page_size
        row = b if cache_batch_idx is None else int(cache_batch_idx[b])
        return np.full(count, row), pos

    for b in range(batch):
        if ragged:
            rows = slice(int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]))
            new_rows = slice(int(cu_new[b]), int(cu_new[b + 1])) if k is not None else slice(0, 0)
            q_b, k_b, v_b = q[rows], (k[new_rows] if k is not None else None), (v[new_rows] if k is not None else None)
        else:
            q_b = q[b]
            k_b, v_b = (k[b], v[b]) if k is not None else (None, None)
        n_new = 0 if k_b is None else k_b.shape[0]
        if n_new:
            where = positions(b, int(seqlens[b]), n_new)
            k_cache[where], v_cache[where] = k_b, v_b
        first, count = int(leftpad[b]), int(seqlens[b]) + n_new - int(leftpad[b])
        if q_b.shape[0] == 0:
            continue
        if count == 0:  # no keys: zero rows, lse -inf (or the sink's logit)
            sinks = options.get("sinks")
            value = -np.inf if sinks is None else np.asarray(sinks, dtype=np.float64)[:, None]
            if ragged:
                lse[:, rows] = value
            else:
                lse[b] = value
            continue
        where = positions(b, first, count)
        seq = dict(options)
        if slopes is not None:
            seq["alibi_slopes"] = slopes[b]
        o, l = attention(q_b[None], k_cache[where][None], v_cache[where][None], **seq)
        if ragged:
            out[rows], lse[:, rows] = o[0], l[0]
        else:
            out[b], lse[b] = o[0], l[0]
    return out, lse, k_cache, v_cache
